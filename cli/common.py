"""What every command shares: the console, option types, and turning errors into one line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from probe.checkpoint import Checkpoint
from probe.errors import ProbeError
from probe.provenance import context
from probe.report.files import atomic_write_json

console = Console()
err_console = Console(stderr=True)

CheckpointArg = Annotated[
    Path, typer.Argument(help="Checkpoint directory (model.safetensors + config.json).")
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Directory to write results into.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
LengthsOpt = Annotated[
    str, typer.Option("--lengths", help="Task lengths: 'lo:hi' (inclusive) or '8,16,32'.")
]
PickleOpt = Annotated[
    bool, typer.Option("--allow-pickle", help="Allow loading pickle weights (runs code: trust it).")
]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="Examples per batch.")]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace the results of an earlier run in --out.")
]


def check_positive(**options: int) -> None:
    """Each named count option must be at least 1 (`--batches 0` would divide by zero)."""
    for name, value in options.items():
        if value < 1:
            flag = "--" + name.replace("_", "-")
            raise ProbeError(f"{flag} must be at least 1, got {value}.")


def require_heads(ckpt: Checkpoint) -> None:
    """A model whose every head was pruned has no attention to measure."""
    if not any(s.kept_heads for s in ckpt.model_cfg.sites()):
        raise ProbeError(
            f"{ckpt.path}: every attention head was pruned, so there is nothing to measure."
        )


def write_manifest(out: Path, ckpt: Checkpoint, device: str, **settings) -> None:
    """OUT/manifest.json: the command, its settings, the checkpoint's config and provenance."""
    atomic_write_json(
        out / "manifest.json",
        {"command": settings.pop("command"), "checkpoint": str(ckpt.path), "settings": settings,
         "model": ckpt.model_cfg.to_dict(), "task": ckpt.task.to_dict(), **context(device)},
    )  # fmt: skip
