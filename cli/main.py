"""The `probe` command line: thin Typer commands over library functions."""

from __future__ import annotations

import signal
import sys
from typing import Annotated

import typer
from probe_cli import (
    generate,
    heal,
    importance,
    inspect,
    interop,
    kv,
    prune,
    scaling,
    study,
    train,
    view,
)
from probe_cli.common import Group, err_console, shown

from probe.allocator import return_large_blocks
from probe.errors import Interrupted, ProbeError

app = typer.Typer(
    name="probe",
    help="Train Transformers, look inside their attention, prune their heads, run studies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("probe")
        except PackageNotFoundError:  # run from a source tree that was never installed
            number = "unknown (not installed)"
        typer.echo(f"probe {number}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_version, help="Print the version."),
    ] = False,
) -> None:
    """The group's own option (--version); its help is the Typer app's."""


for module in (train, interop, inspect, scaling, importance, prune, heal, kv, generate, study,
               view):  # fmt: skip
    module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: a ProbeError (bad user input) is one line on stderr and exit code 2;
    `--debug` anywhere on the command line shows the traceback instead."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    return_large_blocks()  # freed tensors go back to the system (probe.allocator)
    previous = signal.signal(signal.SIGINT, _interrupt)
    previous_term = signal.signal(signal.SIGTERM, _interrupt)  # kill PID: stop as cleanly
    try:
        app(args=args, prog_name="probe")  # Group.main: a usage error is one line, exit 2
    except ProbeError as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {shown(exc)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, Interrupted) as exc:
        kept = str(exc) or "what was already written is kept"
        err_console.print(
            f"[bold yellow]interrupted:[/] {shown(kept)}", highlight=False, soft_wrap=True
        )
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        from probe.files import no_space

        if full := no_space(exc):  # the environment, not a bug: one line, as bad input is
            err_console.print(f"[bold red]error:[/] {shown(full)}", highlight=False, soft_wrap=True)
            sys.exit(2)
        err_console.print(
            f"[bold red]error:[/] {type(exc).__name__}: {shown(exc)} "
            "(run with --debug for the traceback)",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


def _interrupt(signum, frame) -> None:
    """Ctrl-C (and SIGTERM) raises Interrupted rather than KeyboardInterrupt, which the Typer
    app would turn into a silent exit 130; library code adds what it kept, and `main` prints
    it."""
    raise Interrupted()


if __name__ == "__main__":
    main()
