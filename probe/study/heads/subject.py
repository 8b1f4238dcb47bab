"""What every step of a head study works on: the imported model with its text splits and needle
prompts (`Subject`, built once per process and only when a step needs it), and the digest of the
model's files that every step's hash holds."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import pandas as pd

from probe.analysis.retrieval import needle_prompts, retrieval_scores
from probe.data.text import read_documents
from probe.interop.importer import import_model
from probe.measure.evaluate import text_splits_for
from probe.model.rescale import with_rope_scaling
from probe.rope_experiment import check_rotary
from probe.runtime import Runtime
from probe.study.heads.checks import check_source
from probe.study.heads.study import HeadStudy


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
                 path: Path | None = None, workdir: Path | None = None) -> None:  # fmt: skip
        self.study = study
        # where a long step keeps the state it resumes from (the run's steps/ folder)
        self._workdir = workdir
        self.runtime = runtime or Runtime.cpu()
        self.path = path or check_source(study.source, study.where)
        self._checked = False
        self.memo: dict = {}  # what steps share within a process (a method's head scores)

    def check(self, fit: Callable[[Subject], None]) -> None:
        """What the study asks of its model (`fit`: `steps.check_fit`), checked once the model
        is loaded (ProbeError)."""
        if not self._checked:
            fit(self)
            self._checked = True

    @cached_property
    def digest(self) -> str:
        """sha256 of the model's files (what every step's hash holds), and of the rotary
        scaling the study runs it with where it sets one: the model the steps measure."""
        files = source_digest(self.path)
        if self.study.rope_scaling is None:
            return files
        text = json.dumps([files, self.study.rope_scaling.to_dict()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def workdir(self) -> Path:
        if self._workdir is None:  # a subject built outside a run: a fresh folder of its own
            import tempfile

            self._workdir = Path(tempfile.mkdtemp(prefix="probe-steps-"))
        return self._workdir

    @cached_property
    def imported(self):
        imported = import_model(self.path, dtype=self.runtime.dtype)  # None: the source's own
        imported.model.to(self.runtime.device)
        request = self.study.rope_scaling
        if request is not None:  # [model] rope_scaling: its context the model's own
            check_rotary(imported.model.cfg, self.study.source,
                         f"{self.study.where} [model] rope_scaling")  # fmt: skip
            with_rope_scaling(imported.model, request.complete(imported.model.cfg.max_len))
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
