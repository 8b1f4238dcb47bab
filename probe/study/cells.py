"""What one cell does: train its model (or reuse the cached one), run its analyses, write its
tables; `done.json` is written last, so a cell directory without it is unfinished.

    results/NAME/models/<train key>/   checkpoint (renamed into place only when complete)
    results/NAME/cells/<cell key>/     one CSV per table (identity columns first), done.json
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from probe import provenance
from probe.errors import ProbeError
from probe.files import TMP_SUFFIX
from probe.report.files import atomic_write_csv, atomic_write_json
from probe.study.documents import read_json
from probe.study.grid import Cell
from probe.study.steps import StepContext, get_step

DONE = "done.json"


@dataclass(frozen=True)
class CellEvent:
    """Progress inside one cell: `phase` is "train" or an analysis name."""

    index: int
    phase: str
    done: int
    total: int
    note: str = ""


@dataclass(frozen=True)
class CellRecord:
    index: int
    key: str
    tables: tuple[str, ...]
    wall_s: float  # seconds the run that computed the cell spent on it
    train_s: float  # seconds spent training (0 when the model came from the cache)
    cached: bool  # finished in an earlier run
    git_commit: str | None = None  # the code that computed it (None: not recorded)


def cell_dir(root: Path, cell: Cell) -> Path:
    return root / "cells" / cell.key


def model_dir(root: Path, cell: Cell) -> Path:
    return root / "models" / cell.train_key


def read_done(root: Path, cell: Cell) -> dict | None:
    path = cell_dir(root, cell) / DONE
    if not path.exists():
        return None
    try:
        done = read_json(path)
    except ProbeError:
        return None  # cannot happen with atomic writes, but then the cell is simply redone
    return done if isinstance(done, dict) else None


def _trained_model(cell: Cell, root: Path, device: str, report: Callable[[CellEvent], None]):
    """(model, seconds spent training): the cached checkpoint, or a fresh training run that is
    written under a temporary name and renamed into place when complete."""
    from probe.checkpoint import load_checkpoint
    from probe.training.train import resolve_device, train

    final = model_dir(root, cell)
    if (final / "config.json").exists():
        return load_checkpoint(final, device=resolve_device(device)).model, 0.0
    tmp = final.parent / f".{final.name}{TMP_SUFFIX}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # made here, never removed: cells training in parallel all write beside each other in it
    final.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def on_step(p) -> None:
        note = f"loss {p.loss:.3f}" + (
            f", exact {p.eval_exact:.2f}" if p.eval_exact is not None else ""
        )
        report(CellEvent(cell.index, "train", p.step, p.steps, note))

    result = train(cell.model, cell.task, dataclasses.replace(cell.train, device=device), out=tmp,
                   progress=on_step)  # fmt: skip
    seconds = time.perf_counter() - start
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished the same model first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return result.model, seconds


def with_identity(table: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    ids = cell.identity()
    front = pd.DataFrame({k: [v] * len(table) for k, v in ids.items()}, index=table.index)
    return pd.concat([front, table.drop(columns=[c for c in ids if c in table.columns])], axis=1)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_files(root: Path, cell: Cell, done: dict) -> list[str]:
    """The table files of a finished cell that are missing or no longer match the checksums
    its done.json recorded (cells finished before checksums were recorded are not checked)."""
    out = cell_dir(root, cell)
    bad = []
    for name, digest in done.get("sha256", {}).items():
        path = out / name
        if not path.is_file() or file_digest(path) != digest:
            bad.append(name)
    return bad


def cached_record(root: Path, cell: Cell, stale: Callable[[list[str]], None] | None = None
                  ) -> CellRecord | None:  # fmt: skip
    """The record of a cell finished in an earlier run, or None (also when its files do not
    match their checksums: `stale` is told which, and the cell is computed again)."""
    done = read_done(root, cell)
    if done is None:
        return None
    bad = stale_files(root, cell, done)
    if bad:
        (cell_dir(root, cell) / DONE).unlink()
        if stale is not None:
            stale(bad)
        return None
    return CellRecord(cell.index, cell.key, tuple(done["tables"]), done["wall_s"],
                      done["train_s"], cached=True, git_commit=done.get("git_commit"))  # fmt: skip


def run_cell(
    cell: Cell, root: Path, device: str = "cpu", progress: Callable[[CellEvent], None] | None = None
) -> CellRecord:
    """Run one cell under results directory `root`, or return its cached record."""
    record = cached_record(root, cell)
    if record is not None:
        return record
    try:
        return _run(cell, root, device, progress or (lambda event: None))
    except ProbeError as exc:
        raise ProbeError(f"cell {cell.index} ({cell.label}): {exc}") from exc


def _run(cell: Cell, root: Path, device: str, report: Callable[[CellEvent], None]) -> CellRecord:
    start = time.perf_counter()
    model, train_s = _trained_model(cell, root, device, report)
    out = cell_dir(root, cell)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"train": pd.read_csv(model_dir(root, cell) / "metrics.csv")}
    device_ = next(model.parameters()).device
    for name, options in cell.analysis:

        def on_progress(i: int, n: int, name: str = name) -> None:
            report(CellEvent(cell.index, name, i, n))

        report(CellEvent(cell.index, name, 0, 1))
        context = StepContext(model, cell.task, cell.train, device_, on_progress)
        tables.update(get_step(name).run(context, options))
    digests = {}
    for name, table in tables.items():
        path = atomic_write_csv(out / f"{name}.csv", with_identity(table, cell))
        digests[path.name] = file_digest(path)
    wall = time.perf_counter() - start
    commit = provenance.git_commit()
    record = CellRecord(cell.index, cell.key, tuple(tables), wall, train_s, cached=False,
                        git_commit=commit)  # fmt: skip
    atomic_write_json(out / DONE, {
        "key": cell.key, "train_key": cell.train_key, "label": cell.label,
        "identity": cell.identity(), "tables": list(tables), "wall_s": round(wall, 2),
        "train_s": round(train_s, 2), "device": str(device_), "git_commit": commit,
        "sha256": digests,
    })  # fmt: skip
    return record


def read_table(path: Path | io.StringIO) -> pd.DataFrame:
    """A results CSV with only empty fields as missing ('none' and 'None' stay strings)."""
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], low_memory=False)
    for column in ("variant", "arm"):
        if column in df.columns:
            df[column] = ["" if pd.isna(v) else str(v) for v in df[column]]
    return df


def read_cell_tables(root: Path, cell: Cell, names: tuple[str, ...]) -> dict[str, pd.DataFrame]:
    out = cell_dir(root, cell)
    return {name: read_table(out / f"{name}.csv") for name in names}
