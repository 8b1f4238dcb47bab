"""Running a study: cells in order (or in parallel processes), cached, resumable, with a manifest.

A run takes an exclusive lock on its results directory, skips every cell whose `done.json`
exists, and after each finished cell rewrites `manifest.json` atomically. When all cells are done
it gathers each table over the cells into `tables/<name>.csv`. Killing it at any moment and
starting it again finishes the rest and gives the same tables as an uninterrupted run.
"""

from __future__ import annotations

import fcntl
import io
import os
import queue
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probe import provenance
from probe.errors import Interrupted, ProbeError
from probe.files import TMP_SUFFIX
from probe.report.files import atomic_write_csv, atomic_write_json, atomic_write_text
from probe.study.cells import (
    CellEvent,
    CellRecord,
    cached_record,
    read_cell_tables,
    read_done,
    read_table,
    run_cell,
)
from probe.study.documents import read_json
from probe.study.grid import Cell, expand
from probe.study.spec import Study, study_dict
from probe.training.train import resolve_device
from probe.words import counted

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class StudyEvent:
    """Progress of a run: kind is "start", "cell-start", "cell" (inside a cell), "cell-done", or
    "cell-stale" (a finished cell whose files no longer match their checksums: `note` names them,
    and the cell is computed again)."""

    kind: str
    n_cells: int
    index: int = -1
    label: str = ""
    phase: str = ""
    done: int = 0
    total: int = 0
    note: str = ""
    cached: bool = False


@dataclass
class RunResult:
    out: Path
    cells: list[Cell]
    records: list[CellRecord]
    tables: dict[str, pd.DataFrame]
    manifest: dict[str, Any]


LOCK = ".lock"


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold results directory `out` for one run: an exclusive flock on `out/.lock`, which holds
    the run's process id and is removed when the run ends (normally, on an error or on Ctrl-C).
    A lock file left by a killed run holds no lock (the kernel drops it with its process), so
    it never blocks the next run."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    while True:
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip()
            handle.close()
            who = f" (process {pid})" if pid.isdigit() else ""
            raise ProbeError(
                f"another `probe study run`{who} is writing to {out}; wait for it or use --out."
            ) from None
        try:  # the run before may have removed the file we opened: lock the one in place
            current = os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            break
        handle.close()
    try:
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # still held: nobody else can have locked this file
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def clean_temporaries(out: Path, units: str) -> None:
    """Remove what a killed run left half-written (nothing else is running: we hold the lock):
    only probe's own temporary names, only in the folders a run writes (`out`, its tables/, and
    each folder under `units`: cells/ of a grid study, steps/ of a head study)."""
    for tmp in (out / "models").glob(f".*{TMP_SUFFIX}-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    folders = [out, out / "tables", *sorted((out / units).glob("*"))]
    for folder in folders:
        for tmp in folder.glob(f".*{TMP_SUFFIX}"):
            tmp.unlink(missing_ok=True)


def _owner(out: Path) -> tuple[str, bool] | None:
    """(study name, smoke) of the run that made results directory `out`, or None."""
    for name, keys in (("study.json", ("name", "smoke")), (MANIFEST, ("study", "smoke"))):
        try:
            doc = read_json(out / name)
            return str(doc[keys[0]]), bool(doc.get(keys[1], False))
        except (ProbeError, KeyError, TypeError, AttributeError):
            continue
    return None


def check_results_dir(out: Path, study: Study, overwrite: bool = False) -> None:
    """A results directory belongs to one study (its smoke version is another): refuse another
    study's, or a folder with other files, unless `overwrite`."""
    if out.exists() and not out.is_dir():
        raise ProbeError(f"--out '{out}' is a file; give a directory.")
    if not out.exists() or overwrite or not [p for p in out.iterdir() if p.name != LOCK]:
        return
    owner = _owner(out)
    if owner == (study.name, study.is_smoke):
        return
    if owner is None:
        raise ProbeError(
            f"'{out}' is not empty and is not a results directory of `probe study run`; choose "
            "another --out, or pass --overwrite to write into it anyway."
        )
    name = f"{owner[0]}{' (smoke)' if owner[1] else ''}"
    raise ProbeError(
        f"'{out}' holds the results of study '{name}'; choose another --out, or pass "
        "--overwrite to replace its report and manifest."
    )


def _manifest(study: Study, cells: list[Cell], records: dict[int, CellRecord],
              context: dict[str, Any], started: float) -> dict[str, Any]:  # fmt: skip
    rows = []
    for cell in cells:
        record = records.get(cell.index)
        rows.append({
            "index": cell.index, "key": cell.key, "train_key": cell.train_key, "label": cell.label,
            "arm": cell.arm, "variant": cell.variant, "factors": dict(cell.factors),
            "seed": cell.seed, "status": "pending" if record is None else
            ("cached" if record.cached else "done"),
            "wall_s": None if record is None else round(record.wall_s, 2),
            "train_s": None if record is None else round(record.train_s, 2),
            "git_commit": None if record is None else record.git_commit,
        })  # fmt: skip
    analysis_seeds = {name: getattr(o, "seed", None) for name, o in study.analysis.items()}
    return {
        "study": study.name, "file": study.where, "smoke": study.is_smoke,
        **context,
        "seeds": sorted({c.seed for c in cells}), "analysis_seeds": analysis_seeds,
        "n_cells": len(cells), "n_done": len(records),
        "wall_s": round(time.perf_counter() - started, 2),
        "cells": rows,
    }  # fmt: skip


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` for the block, restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _worker_init(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _run_in_worker(cell: Cell, root: Path, device: str, events: Any) -> CellRecord:
    return run_cell(cell, root, device, events.put)


def run_study(
    study: Study,
    out: Path | str,
    *,
    jobs: int = 1,
    device: str = "auto",
    threads: int = 1,
    progress: Callable[[StudyEvent], None] | None = None,
    overwrite: bool = False,
    executor: str = "local",
    address: str | None = None,
) -> RunResult:
    """Run (or resume) every cell of `study` into results directory `out`.

    jobs: cells run at once, each in its own process (1: in this process). threads: torch CPU
    threads per cell; one is fastest for the small models of the shipped studies (the cores are
    better spent on --jobs). executor "ray" sends each uncached cell to a Ray cluster as a task
    (`address`: the cluster's, or None for a local one; see `probe.study.executors`)."""
    if jobs < 1 or threads < 1:
        raise ProbeError(f"--jobs and --threads must be at least 1, got {jobs} and {threads}.")
    if executor not in ("local", "ray"):
        raise ProbeError(f"--executor must be local or ray, got '{executor}'.")
    if executor == "ray":
        from probe.study.executors import check_ray

        check_ray(address)  # fail now, in one line, when Ray is missing or the address is dead
    out = Path(out)
    check_results_dir(out, study, overwrite)
    cells = expand(study)
    emit = progress or (lambda event: None)
    started = time.perf_counter()
    with locked(out), _threads(threads), provenance.pinned(provenance.git_commit()):
        context = {**provenance.context(resolve_device(device)), "requested_device": device,
                   "jobs": jobs, "threads": threads, "executor": executor}  # fmt: skip
        clean_temporaries(out, "cells")
        if study.path is not None:
            atomic_write_text(out / "study.toml", study.path.read_text(encoding="utf-8"))
        atomic_write_json(out / "study.json", study_dict(study))
        records: dict[int, CellRecord] = {}

        def finished(record: CellRecord) -> None:
            records[record.index] = record
            cell = cells[record.index]
            emit(StudyEvent("cell-done", len(cells), cell.index, cell.label, cached=record.cached))
            atomic_write_json(out / MANIFEST, _manifest(study, cells, records, context, started))

        def begun(cell: Cell) -> None:
            emit(StudyEvent("cell-start", len(cells), cell.index, cell.label))

        def relay(event: CellEvent) -> None:
            cell = cells[event.index]
            emit(StudyEvent("cell", len(cells), event.index, cell.label, event.phase,
                            event.done, event.total, event.note))  # fmt: skip

        emit(StudyEvent("start", len(cells)))
        todo = []
        for cell in cells:

            def stale(names: list[str], cell: Cell = cell) -> None:
                note = f"{', '.join(names)} no longer match their checksums; computing it again"
                emit(StudyEvent("cell-stale", len(cells), cell.index, cell.label, note=note))

            record = cached_record(out, cell, stale)
            if record is None:
                todo.append(cell)
            else:
                finished(record)
        try:
            if executor == "ray" and todo:
                from probe.study.executors import run_on_ray

                run_on_ray(todo, out, device, threads, address, begun, finished)
            elif jobs == 1 or len(todo) <= 1:
                for cell in todo:
                    begun(cell)
                    finished(run_cell(cell, out, device, relay))
            else:
                _run_parallel(todo, cells, out, device, jobs, threads, begun, relay, finished)
        except (KeyboardInterrupt, Interrupted):
            raise Interrupted(
                f"{len(records)} of {counted(len(cells), 'cell')} "
                f"{'is' if len(records) == 1 else 'are'} "
                f"finished and kept in {out}; run the "
                "study again to finish the rest"
            ) from None
        tables = _gather(out, cells, records)
        manifest = _manifest(study, cells, records, context, started)
        atomic_write_json(out / MANIFEST, manifest)
    return RunResult(out, cells, [records[c.index] for c in cells], tables, manifest)


def _run_parallel(todo, cells, out, device, jobs, threads, begun, relay, finished) -> None:
    import multiprocessing as mp

    context = mp.get_context("spawn")
    with (
        context.Manager() as manager,
        ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=_worker_init, initargs=(threads,)
        ) as pool,
    ):
        events = manager.Queue()
        pending = {}
        for cell in todo:
            pending[pool.submit(_run_in_worker, cell, out, device, events)] = cell
        started: set[int] = set()
        try:
            _drain(pending, events, started, cells, begun, relay, finished)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: stop the workers too
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            raise


def _drain(pending, events, started, cells, begun, relay, finished) -> None:
    """Relay the workers' events and collect finished cells until none is pending."""
    while pending:
        done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        while True:
            try:
                event = events.get_nowait()
            except queue.Empty:
                break
            if event.index not in started:
                started.add(event.index)
                begun(cells[event.index])
            relay(event)
        for future in done:
            pending.pop(future)
            finished(future.result())


def _gather(
    out: Path, cells: list[Cell], records: dict[int, CellRecord]
) -> dict[str, pd.DataFrame]:
    """Each table over all cells, in cell order, written to tables/<name>.csv."""
    parts: dict[str, list[pd.DataFrame]] = {}
    for cell in cells:
        for name, table in read_cell_tables(out, cell, records[cell.index].tables).items():
            parts.setdefault(name, []).append(table)
    tables = {}
    for name, frames in parts.items():
        tables[name] = pd.concat(frames, ignore_index=True)
        atomic_write_csv(out / "tables" / f"{name}.csv", tables[name])
    return {name: read_table(out / "tables" / f"{name}.csv") for name in tables}


def finished_tables(out: Path, cells: list[Cell]) -> tuple[dict[str, pd.DataFrame], list[Cell]]:
    """(each table over the finished cells, read as `load_tables` reads it; the unfinished
    cells), for a report on a run still in progress. Writes nothing."""
    parts: dict[str, list[pd.DataFrame]] = {}
    missing = []
    for cell in cells:
        done = read_done(out, cell)
        if done is None:
            missing.append(cell)
            continue
        for name, table in read_cell_tables(out, cell, tuple(done["tables"])).items():
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
    return {p.stem: read_table(p) for p in sorted(folder.glob("*.csv"))}
