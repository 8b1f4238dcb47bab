"""The checksummed cache of a results directory: one folder per unit, its tables as CSV and
`done.json` written last, with the unit's digest and each table file's sha256.

    results/NAME/<folder>/<key>/<table>.csv   the unit's tables
    results/NAME/<folder>/<key>/done.json     {"hash", "tables", "sha256", "seconds", ...}

A unit is reused when its done.json exists, its digest matches and its files match their
checksums. Units finished by earlier versions of probe stay valid: a grid cell's done.json has no
"hash" (its key is its digest) and a head study's step has one table, `table.csv`, named by its
"kind" (and no checksums).
"""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path
from typing import Any

import pandas as pd

from probe import provenance
from probe.errors import ProbeError
from probe.report.files import atomic_write_csv, atomic_write_json
from probe.schema import normalise
from probe.study.documents import read_json
from probe.study.engine.units import Record, Unit

DONE = "done.json"
LEGACY_TABLE = "table.csv"  # a head study step's one table, before the engine


def read_table(path: Path | io.StringIO) -> pd.DataFrame:
    """A results CSV with only empty fields as missing ('none' and 'None' stay strings)."""
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], low_memory=False)
    for column in ("variant", "arm"):
        if column in df.columns:
            df[column] = ["" if pd.isna(v) else str(v) for v in df[column]]
    return df


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Store:
    """The units of one plan under `root/folder`."""

    def __init__(self, root: Path, folder: str) -> None:
        self.root = root
        self.folder = folder

    def dir(self, unit: Unit) -> Path:
        return self.root / self.folder / unit.key

    def done(self, unit: Unit) -> dict[str, Any] | None:
        """The unit's done.json when it is a finished copy of this unit (its digest matches)."""
        return self._read_done(unit)[0]

    def _read_done(self, unit: Unit) -> tuple[dict[str, Any] | None, list[str]]:
        """(the unit's done.json when it is a finished copy of this unit, or None; why a
        done.json that is there does not make the unit finished: none without one)."""
        path = self.dir(unit) / DONE
        if not path.is_file():
            return None, []
        try:
            done = read_json(path)
        except ProbeError:  # cannot happen with atomic writes, but then the unit is redone
            return None, [f"{DONE} cannot be read"]
        if not isinstance(done, dict):
            return None, [f"{DONE} cannot be read"]
        if done.get("hash", unit.key) != unit.digest:
            return None, [f"{DONE} records another hash (what it depends on changed, or the "
                          "file was edited)"]  # fmt: skip
        return done, []

    def record(self, unit: Unit, done: dict[str, Any]) -> Record:
        """The record of a finished copy of `unit` (its done.json), as the cache holds it."""
        seconds = done.get("seconds", done.get("wall_s", 0.0))
        return Record(unit.index, unit.key, unit.digest, tuple(self.files(done)), seconds,
                      cached=True, git_commit=done.get("git_commit"), facts=done)  # fmt: skip

    def files(self, done: dict[str, Any]) -> dict[str, str]:
        """Table name -> file name of a finished unit."""
        if "tables" in done:
            return {name: f"{name}.csv" for name in done["tables"]}
        return {str(done["kind"]): LEGACY_TABLE}

    def stale(self, unit: Unit, done: dict[str, Any]) -> list[str]:
        """What is wrong with the unit's files: each one missing or no longer matching its
        recorded checksum, in words ("eval.csv is missing")."""
        folder = self.dir(unit)
        missing = [f for f in self.files(done).values() if not (folder / f).is_file()]
        bad = [f"{f} is missing" for f in missing]
        for name, digest in done.get("sha256", {}).items():
            path = folder / name
            if name in missing:
                continue
            if not path.is_file():
                bad.append(f"{name} is missing")
            elif file_digest(path) != digest:
                bad.append(f"{name} does not match its checksum")
        return bad

    def cached(self, unit: Unit) -> tuple[Record | None, list[str]]:
        """(the record of a finished copy of `unit`, or None; what made a finished copy
        invalid, in words: its done.json is removed, so it is computed again)."""
        done, why = self._read_done(unit)
        if done is None:
            return None, why
        bad = self.stale(unit, done)
        if bad:
            (self.dir(unit) / DONE).unlink(missing_ok=True)
            return None, bad
        return self.record(unit, done), []

    def write(self, unit: Unit, tables: dict[str, pd.DataFrame], facts: dict[str, Any],
              seconds: float) -> Record:  # fmt: skip
        """Write a computed unit: its tables, then done.json (last: a unit without it is
        unfinished)."""
        folder = self.dir(unit)
        folder.mkdir(parents=True, exist_ok=True)
        digests = {}
        for name, table in tables.items():
            path = atomic_write_csv(folder / f"{name}.csv", table)
            digests[path.name] = file_digest(path)
        commit = provenance.git_commit()
        done = {"hash": unit.digest, **facts, "tables": list(tables), "seconds": round(seconds, 2),
                "git_commit": commit, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "sha256": digests}  # fmt: skip
        atomic_write_json(folder / DONE, done)
        return Record(unit.index, unit.key, unit.digest, tuple(tables), seconds, cached=False,
                      git_commit=commit, facts=done)  # fmt: skip

    def read(self, record: Record) -> dict[str, pd.DataFrame]:
        """The tables of a finished unit."""
        folder = self.root / self.folder / record.key
        files = self.files(record.facts)
        return {name: normalise(name, read_table(folder / files[name]))  # an older schema too
                for name in record.tables}  # fmt: skip
