"""A grid study's plan: one unit per cell, which trains its model (or reuses the cached one),
runs its analyses and returns its tables with the cell's identity columns.

    results/NAME/models/<train key>/   checkpoint (renamed into place only when complete)
    results/NAME/cells/<cell key>/     one CSV per table (identity columns first), done.json
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.files import TMP_SUFFIX
from probe.runtime import resolve_device
from probe.study.engine import Plan, Record, Unit
from probe.study.engine.units import Progress
from probe.study.grid.cells import Cell, expand
from probe.study.grid.spec import Study, study_dict
from probe.study.grid.steps import StepContext, get_step
from probe.training.train import train


def model_dir(root: Path, cell: Cell) -> Path:
    return root / "models" / cell.train_key


def with_identity(table: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    ids = cell.identity()
    front = pd.DataFrame({k: [v] * len(table) for k, v in ids.items()}, index=table.index)
    return pd.concat([front, table.drop(columns=[c for c in ids if c in table.columns])], axis=1)


@dataclass(frozen=True)
class GridContext:
    root: Path
    device: str


@dataclass(frozen=True)
class CellUnit(Unit):
    cell: Cell

    def run(self, context: GridContext, progress: Progress) -> tuple[dict, dict]:
        try:
            return self._run(context, progress)
        except ProbeError as exc:
            raise ProbeError(f"cell {self.cell.index} ({self.cell.label}): {exc}") from exc

    def _run(self, context: GridContext, progress: Progress) -> tuple[dict, dict]:
        cell = self.cell
        model, train_s = _trained_model(cell, context, progress)
        tables = {"train": pd.read_csv(model_dir(context.root, cell) / "metrics.csv")}
        device = next(model.parameters()).device
        for name, options in cell.analysis:

            def on_progress(i: int, n: int, name: str = name) -> None:
                progress(name, i, n, "")

            progress(name, 0, 1, "")
            step_context = StepContext(model, cell.task, cell.train, device, on_progress)
            tables.update(get_step(name).run(step_context, options))
        tables = {name: with_identity(table, cell) for name, table in tables.items()}
        facts = {"key": cell.key, "train_key": cell.train_key, "label": cell.label,
                 "identity": cell.identity(), "train_s": round(train_s, 2),
                 "device": str(device)}  # fmt: skip
        return tables, facts


def _trained_model(cell: Cell, context: GridContext, progress: Progress):
    """(model, seconds spent training): the cached checkpoint, or a fresh training run that is
    written under a temporary name and renamed into place when complete."""
    final = model_dir(context.root, cell)
    if (final / "config.json").exists():
        return load_checkpoint(final, device=resolve_device(context.device)).model, 0.0
    tmp = final.parent / f".{final.name}{TMP_SUFFIX}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # made here, never removed: cells training in parallel all write beside each other in it
    final.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def on_step(p) -> None:
        note = f"loss {p.loss:.3f}" + (
            f", exact {p.eval_exact:.2f}" if p.eval_exact is not None else ""
        )
        progress("train", p.step, p.steps, note)

    config = dataclasses.replace(cell.train, device=context.device)
    result = train(cell.model, cell.task, config, out=tmp, progress=on_step)
    seconds = time.perf_counter() - start
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished the same model first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return result.model, seconds


class GridPlan(Plan):
    """Every cell of a grid study (model x task x training x seed, with its analyses)."""

    folder = "cells"
    noun = "cell"

    def __init__(self, study: Study, root: Path, settings) -> None:
        if settings.dtype is not None:
            raise ProbeError("--dtype sets the weights' dtype of a head study's real model; a "
                             "grid study trains its models in float32 (bf16 autocast on CUDA): "
                             "drop --dtype.")  # fmt: skip
        super().__init__(study, root, settings)
        self.cells = expand(study)

    def units(self, finished: dict[str, list[pd.DataFrame]]) -> list[Unit]:
        if finished:
            return []
        return [CellUnit(c.index, c.key, c.label, c.key, c) for c in self.cells]

    def size(self) -> int:
        return len(self.cells)

    def context(self) -> GridContext:
        return GridContext(Path(self.root), self.settings.device)

    def context_key(self) -> tuple:
        return (self.settings.device,)

    def study_dict(self) -> dict[str, Any]:
        return study_dict(self.study)

    def manifest(self, records: list[Record], run: dict[str, Any]) -> dict[str, Any]:
        study = self.study
        done = {r.index: r for r in records}
        rows = []
        for cell in self.cells:
            r = done.get(cell.index)
            rows.append({
                "index": cell.index, "key": cell.key, "train_key": cell.train_key,
                "label": cell.label, "arm": cell.arm, "variant": cell.variant,
                "factors": dict(cell.factors), "seed": cell.seed,
                "status": "pending" if r is None else ("cached" if r.cached else "done"),
                "wall_s": None if r is None else round(r.seconds, 2),
                "train_s": None if r is None else round(r.facts.get("train_s", 0.0), 2),
                "git_commit": None if r is None else r.git_commit,
            })  # fmt: skip
        analysis_seeds = {name: getattr(o, "seed", None) for name, o in study.analysis.items()}
        wall_s = run.pop("wall_s")
        return {
            "study": study.name, "file": study.where, "smoke": study.is_smoke, **run,
            "seeds": sorted({c.seed for c in self.cells}), "analysis_seeds": analysis_seeds,
            "n_cells": len(self.cells), "n_done": len(records), "wall_s": wall_s, "cells": rows,
        }  # fmt: skip
