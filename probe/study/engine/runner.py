"""One runner for every study kind: lock, cache, executors, progress, manifest, tables.

A run takes an exclusive lock on its results directory, reuses every unit whose finished copy is
still valid, runs the rest, and after each finished unit rewrites `manifest.json` atomically.
When the plan is complete it gathers each table over the units, in plan order, into
`tables/<name>.csv`. Killing it at any moment and starting it again finishes the rest and gives
the same tables as an uninterrupted run.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe import provenance
from probe.errors import Interrupted, ProbeError
from probe.report.files import atomic_write_csv, atomic_write_json, atomic_write_text
from probe.runtime import resolve_device
from probe.schema import normalise
from probe.study.engine.executors import check_ray, run_here, run_on_ray, run_pool
from probe.study.engine.store import Store, read_table
from probe.study.engine.units import Event, Plan, Record, Unit
from probe.study.engine.workdir import GRID, MANIFEST, check_results_dir, clean_temporaries, locked
from probe.words import counted


@dataclass
class RunResult:
    out: Path
    records: list[Record]  # in plan order
    tables: dict[str, pd.DataFrame]
    manifest: dict[str, Any]

    @property
    def n_cached(self) -> int:
        return sum(r.cached for r in self.records)

    @property
    def n_run(self) -> int:
        return len(self.records) - self.n_cached


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` for the block, restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_settings(plan: Plan) -> None:
    s = plan.settings
    if s.jobs < 1 or s.threads < 1:
        raise ProbeError(f"--jobs and --threads must be at least 1, got {s.jobs} and {s.threads}.")
    if s.executor not in ("local", "ray"):
        raise ProbeError(f"--executor must be local or ray, got '{s.executor}'.")
    if s.executor == "ray":
        check_ray(s.address)  # fail now, in one line, when Ray is missing or the address is dead


def run_plan(plan: Plan, *, progress: Callable[[Event], None] | None = None,
             overwrite: bool = False) -> RunResult:  # fmt: skip
    """Run (or resume) every unit of `plan` into its results directory `plan.root` (the study
    file, when it has one, is kept beside the results as study.toml)."""
    check_settings(plan)
    out = plan.root
    study = plan.study_dict()
    check_results_dir(out, plan.study, overwrite, study.get("kind", GRID))
    emit = progress or (lambda event: None)
    started = time.perf_counter()
    settings = plan.settings
    store = Store(out, plan.folder)
    with locked(out), _threads(settings.threads), provenance.pinned(provenance.git_commit()):
        clean_temporaries(out, plan.folder)
        if plan.study.path is not None:
            atomic_write_text(out / "study.toml", plan.study.path.read_text(encoding="utf-8"))
        atomic_write_json(out / "study.json", study)
        context = plan.context()
        total = plan.size()
        records: dict[int, Record] = {}
        finished_tables: dict[str, list[pd.DataFrame]] = {}
        planned: list[Unit] = []

        def run_info() -> dict[str, Any]:
            device = resolve_device(settings.device)
            return {**provenance.context(device, model=getattr(context, "loaded", None)),
                    "requested_device": settings.device, "jobs": settings.jobs,
                    "threads": settings.threads, "executor": settings.executor,
                    "wall_s": round(time.perf_counter() - started, 2)}  # fmt: skip

        def write_manifest() -> dict[str, Any]:
            ordered = [records[u.index] for u in planned if u.index in records]
            manifest = plan.manifest(ordered, run_info())
            atomic_write_json(out / MANIFEST, manifest)
            return manifest

        def finished(record: Record) -> None:
            records[record.index] = record
            unit = by_index[record.index]
            emit(Event("unit-done", total, unit.index, unit.label, cached=record.cached))
            write_manifest()

        def begun(unit: Unit) -> None:
            emit(Event("unit-start", total, unit.index, unit.label))

        def relay(event: tuple) -> None:
            index, phase, done, n, note = event
            emit(Event("unit", total, index, by_index[index].label, phase, done, n, note))

        by_index: dict[int, Unit] = {}
        emit(Event("start", total))
        try:
            while units := plan.units(finished_tables):
                planned += units
                by_index.update({u.index: u for u in units})
                todo = []
                for unit in units:
                    record, stale = store.cached(unit)
                    if stale:
                        note = f"{'; '.join(stale)}; computing it again"
                        emit(Event("unit-stale", total, unit.index, unit.label, note=note))
                    if record is None:
                        todo.append(unit)
                    else:
                        finished(record)
                _execute(plan, todo, context, begun, relay, finished)
                for unit in units:
                    for name, table in store.read(records[unit.index]).items():
                        finished_tables.setdefault(name, []).append(table)
        except (KeyboardInterrupt, Interrupted):
            n = len(records)
            raise Interrupted(
                f"{n} of {counted(max(total, len(planned)), plan.noun)} "
                f"{'is' if n == 1 else 'are'} finished and kept in {out}; run the study again "
                "to finish the rest"
            ) from None
        tables = _gather(out, finished_tables)
        manifest = write_manifest()
    return RunResult(out, [records[u.index] for u in planned], tables, manifest)


def _execute(plan: Plan, todo: list[Unit], context: Any, begun, relay, finished) -> None:
    settings = plan.settings
    if not todo:
        return
    if settings.executor == "ray":
        run_on_ray(plan, todo, settings, begun, finished)
    elif settings.jobs == 1 or len(todo) == 1:
        run_here(plan, todo, context, begun, relay, finished)
    else:
        run_pool(plan, todo, settings, begun, relay, finished)


def _gather(out: Path, parts: dict[str, list[pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Each table over all units, in plan order (units without rows left out), written to
    tables/<name>.csv and read back as every reader reads it; a table an earlier run made and
    this one does not (an analysis dropped, no rows now) is removed."""
    tables = {}
    for name, frames in parts.items():
        frames = [f for f in frames if not f.empty]
        if not frames:
            continue
        path = atomic_write_csv(
            out / "tables" / f"{name}.csv", pd.concat(frames, ignore_index=True)
        )
        tables[name] = read_table(path)
    for old in (out / "tables").glob("*.csv"):
        if old.stem not in tables:
            old.unlink()
    return tables


def finished_tables(plan: Plan) -> tuple[dict[str, pd.DataFrame], list[Unit]]:
    """(each table over the finished units of the plan's first stage, read as `load_tables`
    reads it; the unfinished units), for a report on a run still in progress. Writes nothing."""
    store = Store(plan.root, plan.folder)
    parts: dict[str, list[pd.DataFrame]] = {}
    missing = []
    for unit in plan.units({}):
        done = store.done(unit)  # not checked against its checksums: nothing is removed
        if done is None:
            missing.append(unit)
            continue
        for name, table in store.read(store.record(unit, done)).items():
            parts.setdefault(name, []).append(table)
    tables = {}
    for name, frames in parts.items():
        text = pd.concat(frames, ignore_index=True).to_csv(index=False)
        tables[name] = read_table(io.StringIO(text))
    return tables, missing


def load_tables(out: Path | str) -> dict[str, pd.DataFrame]:
    """The gathered tables of a finished results directory."""
    folder = Path(out) / "tables"
    if not folder.is_dir():
        raise ProbeError(f"{out} holds no tables/ folder; is it a finished `probe study run`?")
    return {p.stem: normalise(p.stem, read_table(p)) for p in sorted(folder.glob("*.csv"))}
