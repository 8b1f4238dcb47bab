"""A results directory as the engine holds it: one run at a time (a lock), only its own study's
results, and nothing half-written left behind by a killed run."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from probe.errors import ProbeError
from probe.files import TMP_SUFFIX
from probe.study.documents import read_json

MANIFEST = "manifest.json"
LOCK = ".lock"
GRID = "grid"  # the kind of a results directory whose study.json names none


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


def _owner(out: Path) -> tuple[str, bool, str] | None:
    """(study name, smoke, kind) of the run that made results directory `out`, or None."""
    for name, keys in (("study.json", ("name", "smoke")), (MANIFEST, ("study", "smoke"))):
        try:
            doc = read_json(out / name)
            return str(doc[keys[0]]), bool(doc.get(keys[1], False)), doc.get("kind", GRID)
        except (ProbeError, KeyError, TypeError, AttributeError):
            continue
    return None


def check_results_dir(out: Path, study, overwrite: bool = False, kind: str = GRID) -> None:
    """A results directory belongs to one study of one kind (its smoke version is another):
    refuse another study's, or a folder with other files, unless `overwrite`."""
    if out.exists() and not out.is_dir():
        raise ProbeError(f"--out '{out}' is a file; give a directory.")
    if not out.exists() or overwrite or not [p for p in out.iterdir() if p.name != LOCK]:
        return
    owner = _owner(out)
    if owner == (study.name, study.is_smoke, kind):
        return
    if owner is None:
        raise ProbeError(
            f"'{out}' is not empty and is not a results directory of `probe study run`; choose "
            "another --out, or pass --overwrite to write into it anyway."
        )
    name = f"{owner[0]}{' (smoke)' if owner[1] else ''}"
    other = f" (a {owner[2]} study), not of this {kind} study" if owner[2] != kind else ""
    raise ProbeError(
        f"'{out}' holds the results of study '{name}'{other}; choose another --out, or pass "
        "--overwrite to replace its report and manifest."
    )
