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

from probe.pruning.run import Data, task_lengths

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
    """The task lengths of --lengths, or those trained on (`probe.pruning.run.task_lengths`)."""
    from probe.data.tasks import parse_lengths

    return task_lengths(ckpt, parse_lengths(spec) if spec else None)


def check_data(ckpt: Checkpoint, data: Data, n: int = 1,
               max_batch_tokens: int | None = None) -> None:  # fmt: skip
    """Refuse `n` importance splits and a scoring split of `data` that would not fit, run
    `max_batch_tokens` tokens at a time (naming the options that make them smaller), and say
    when only the beginning of a large --text is read."""
    width = "--max-tokens" if ckpt.imported else "--lengths"
    rows = [data.max_tokens] if ckpt.imported else data.lengths_for(ckpt)
    check_data_fits(ckpt, rows, data.batch_size, data.batches, n + 1, backward=True,
                    options=f"--batches, --batch-size or {width}",
                    max_batch_tokens=max_batch_tokens)  # fmt: skip
    if ckpt.imported:
        note_text(data.text)


def splits(ckpt: Checkpoint, lengths, batch_size: int, batches: int, seed: int, n: int = 1,
           text: tuple = (None, False, 128), max_batch_tokens: int | None = None):  # fmt: skip
    """Importance splits and a scoring split: task data, or text for an imported model; checked
    to fit when run `max_batch_tokens` tokens at a time (`check_data`)."""
    path, whole, max_tokens = text
    data = Data(lengths or None, path, whole, max_tokens, batch_size, batches)
    check_data(ckpt, data, n, max_batch_tokens)
    return data.splits(ckpt, n, seed, max_batch_tokens)


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
    """What a manifest says of an imported model's (--text, --whole, --max-tokens)."""
    text, whole, max_tokens = data
    return Data(text=text, whole=whole, max_tokens=max_tokens).text_record(ckpt)


def data_name(ckpt: Checkpoint) -> str:
    return ckpt.task.name if ckpt.task is not None else str(ckpt.source["model_type"])
