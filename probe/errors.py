class ProbeError(ValueError):
    """An error caused by user input; the CLI prints it as one line and exits with code 2."""


class Interrupted(BaseException):
    """The user stopped a command (Ctrl-C); the message says what was kept. A BaseException, like
    KeyboardInterrupt, so no `except Exception` swallows it. The CLI prints it and exits 130."""
