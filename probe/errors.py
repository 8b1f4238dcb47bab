class ProbeError(ValueError):
    """An error caused by user input; the CLI prints it as one line and exits with code 2."""
