"""What `probe importance` and `probe prune` share: their data (task splits, or text for an
imported model), option types and progress bars."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer
from probe_cli.common import (
    check_data_fits,
    console,
    note_text,
)
from probe_cli.preflight import at_least_one
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from probe.checkpoint import Checkpoint

LengthsOpt = Annotated[
    str | None,
    typer.Option("--lengths", help="Task lengths, 'lo:hi' or '8,16' (default: the training ones)."),
]
BatchesOpt = Annotated[
    int,
    typer.Option("--batches", help="Batches per length in each split.", callback=at_least_one),
]
NormalizeOpt = Annotated[
    bool, typer.Option("--normalize", help="L2-normalize importance within each layer.")
]


def lengths_for(ckpt: Checkpoint, spec: str | None) -> list[int]:
    from probe.data.tasks import parse_lengths
    from probe.measure.evaluate import check_lengths

    if ckpt.imported:
        return []
    lo, hi = ckpt.train_cfg.train_len
    lengths = parse_lengths(spec) if spec else list(range(lo, hi + 1))
    check_lengths(ckpt.model, ckpt.task, lengths)
    return lengths


def splits(ckpt: Checkpoint, lengths, batch_size: int, batches: int, seed: int, n: int = 1,
           text: tuple = (None, False, 128), max_batch_tokens: int | None = None):  # fmt: skip
    """Importance splits and a scoring split: task data, or text for an imported model; checked
    to fit when run `max_batch_tokens` tokens at a time."""
    from probe.pruning.splits import checkpoint_splits

    width = "--max-tokens" if ckpt.imported else "--lengths"
    check_data_fits(ckpt, [text[2]] if ckpt.imported else lengths, batch_size, batches, n + 1,
                    backward=True, options=f"--batches, --batch-size or {width}",
                    max_batch_tokens=max_batch_tokens)  # fmt: skip
    path, whole, max_tokens = text
    if ckpt.imported:
        note_text(path)
    return checkpoint_splits(ckpt, lengths, batch_size, batches, seed, n, text=path, whole=whole,
                             max_tokens=max_tokens, max_batch_tokens=max_batch_tokens)  # fmt: skip


def progress_bar() -> Progress:
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
    )  # fmt: skip
    return Progress(*columns, console=console, transient=True)


def phased(bar: Progress) -> Callable[[str, int, int], None]:
    """A (phase, done, total) callback with one bar per phase."""
    jobs: dict[str, int] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in jobs:
            jobs[phase] = bar.add_task(phase, total=total)
        bar.update(jobs[phase], completed=done, total=total)

    return update


def text_settings(ckpt: Checkpoint, data: tuple) -> dict:
    if not ckpt.imported:
        return {}
    text, whole, max_tokens = data
    return {"text": str(text) if text else "shipped corpus", "whole": whole,
            "max_tokens": max_tokens}  # fmt: skip


def data_name(ckpt: Checkpoint) -> str:
    return ckpt.task.name if ckpt.task is not None else str(ckpt.source["model_type"])
