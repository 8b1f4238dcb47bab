"""Pre-flight: the plain mistakes answered before torch is imported, in well under a second.

A checkpoint or --text that is not there, a count of 0, a seed, share or dtype out of range
are checked as the command line is parsed, by a callback on the shared option type that
carries the check (`probe_cli.common`: CheckpointArg, TextOpt, BatchSizeOpt, SeedOpt, ...),
so every command that takes the option checks it, before its body runs. What a command checks
itself (its names, its --out claim: `probe.files.claim_output`) it checks first, importing
torch only after (`tests/test_cli_quick_errors.py` holds every command to that). Nothing here
imports torch: `probe.checkpoint_files` reads a checkpoint's config.json without it.

    fraction: Annotated[float, typer.Option(callback=share_given)] = 0.5
"""

from __future__ import annotations

from pathlib import Path

from probe.checkpoint_files import read_config
from probe.dtype_names import dtype_named
from probe.errors import ProbeError


def check_positive(**options: int) -> None:
    """Each named count option must be at least 1 (`--batches 0` would divide by zero)."""
    for name, value in options.items():
        if value < 1:
            flag = name if name.startswith("-") else "--" + name.replace("_", "-")
            raise ProbeError(f"{flag} must be at least 1, got {value}.")


def check_seed(seed: int) -> None:
    """A seed torch's generators take: 0 to 2**63 - 1."""
    if not 0 <= seed < 2**63:
        raise ProbeError(f"--seed must be a whole number from 0 to 2**63 - 1, got {seed}.")


def _flag(param) -> str:
    """The option as the user types it (`--batch-size`), or an argument's name."""
    named = [o for o in param.opts if o.startswith("-")]
    return named[0] if named else param.human_readable_name


def checkpoint_given(ctx, param, value: Path | None) -> Path | None:
    """A checkpoint exists and is a probe checkpoint directory: its config.json is read (no
    weight, no torch). A parameter callback: `typer.Option(callback=checkpoint_given)`."""
    if value is not None and not ctx.resilient_parsing:
        read_config(value)
    return value


def text_given(ctx, param, value: Path | None) -> Path | None:
    """A --text file that is not there, said as `probe.data.text.read_documents` says it."""
    if value is not None and not ctx.resilient_parsing and not value.exists():
        raise ProbeError(f"No text file at {value}: give the path of a UTF-8 text file.")
    return value


def at_least_one(ctx, param, value: int | None) -> int | None:
    """A count option (None: its default, decided later) is at least 1 (`check_positive`)."""
    if value is not None and not ctx.resilient_parsing:
        check_positive(**{_flag(param): value})
    return value


def seed_given(ctx, param, value: int) -> int:
    """A seed torch's generators take (`check_seed`)."""
    if not ctx.resilient_parsing:
        check_seed(value)
    return value


def dtype_given(ctx, param, value: str | None) -> str | None:
    """A --dtype name probe holds weights in (None: the checkpoint's own)."""
    if value is not None and not ctx.resilient_parsing:
        dtype_named(value)
    return value


def share_given(ctx, param, value: float | None) -> float | None:
    """A share option (a fraction of the heads) lies in [0, 1]."""
    if value is not None and not ctx.resilient_parsing and not 0.0 <= value <= 1.0:
        raise ProbeError(f"{_flag(param)} must be a share between 0 and 1, got {value}.")
    return value
