"""Run the `probe` entry point in-process, as a shell would, and get its exit status."""

from __future__ import annotations

from probe_cli.main import main


def exit_code(args: list[str]) -> int:
    """The exit status of `probe ARGS...` (0 when it returns without raising SystemExit)."""
    try:
        main(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        return 1  # sys.exit("message")
    return 0
