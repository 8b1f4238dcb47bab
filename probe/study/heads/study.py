"""What a head study is: its model, its text and the options of each of its sections, as frozen
dataclasses. A section of the study file ([kv], [heal], ...) is declared by the step module that
reads it (`StudySection`, in `heads/steps/`); this module declares only the two sections every
step shares: [text] (what the model reads) and [operating] (how far a metric may move). spec.py
reads the sections from a study file, each section's declaration checks its values."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.options import option
from probe.rope_experiment import RopeRequest
from probe.study.verdicts.contrast import Contrast
from probe.study.verdicts.expect import Expectation


@dataclass(frozen=True)
class StudySection:
    """A section of a head study file ([kv]): `options` is its frozen dataclass (fields with
    `probe.options.option` bounds, checked when the file is read); `order` places it among the
    file's sections (and in study.json). `check(study)` checks how its fields fit together (and
    with other sections); `fit(subject)` what it asks of the imported model, before the first step
    runs; `methods()` the names its `method_fields` may list; `listed(options)` the methods its
    table holds (what a contrast's a and b may name); `turns_on`: a study that has the section
    runs its steps (else its options say when)."""

    name: str
    order: int
    options: type
    check: Callable[[HeadStudy], None] | None = None
    fit: Callable[[Any], None] | None = None
    methods: Callable[[], Sequence[str]] | None = None
    method_fields: tuple[str, ...] = ("methods",)
    listed: Callable[[Any], tuple[str, ...]] | None = None
    turns_on: bool = False


@dataclass(frozen=True)
class TextOptions:
    file: str = ""  # a text file (relative to the study file); "" is the shipped corpus
    whole: bool = False  # the whole file as one document (else blank-line paragraphs)
    max_tokens: int = option(128, low=2, help="tokens per row")
    batch_size: int = option(8, low=1, help="rows per batch")
    # batches per set: one importance set per seed, one scoring set
    batches: int = option(4, low=1, help="batches per split")
    # disjoint importance sets (seed r also seeds the random baseline)
    seeds: int = option(3, low=1, help="disjoint importance splits")


@dataclass(frozen=True)
class OperatingOptions:
    # how far the primary metric may move from the unpruned model's: similarity may fall by this
    # much, loss (nats) may rise by this much
    tolerance: float = option(0.01, low=0, help="how far the primary metric may move")


TEXT = StudySection("text", 0, TextOptions)
OPERATING = StudySection("operating", 100, OperatingOptions)


@dataclass(frozen=True)
class HeadStudy:
    """A head study: its heading, model and verdicts, and `sections`: section name -> options
    (every declared section, its defaults where the file leaves it out), read as attributes
    (`study.kv`); `given`: the sections the file has."""

    name: str
    question: str
    source: str  # what `probe import` takes
    path: Path | None = None
    # [model] rope_scaling: the model's rotary layers run, training-free, with this scaling
    # instead of their own (its context, where not given, the model's max_position_embeddings)
    rope_scaling: RopeRequest | None = None
    description: str = ""
    title: str = ""
    sections: Mapping[str, Any] = field(default_factory=dict, hash=False)
    given: frozenset[str] = frozenset()
    expectations: tuple[Expectation, ...] = ()  # checked on the tables after a run
    contrasts: tuple[Contrast, ...] = ()  # claims tested over seeds (the report's verdicts)
    smoke: dict[str, Any] | None = field(default=None, compare=False)
    is_smoke: bool = False

    def __getattr__(self, name: str) -> Any:
        """A section's options by its name (`study.kv`); only called for what is no field."""
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"a head study has no section or field '{name}'")

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else "study"

    def text_file(self) -> Path | None:
        if not self.text.file:
            return None
        base = self.path.parent if self.path is not None else Path.cwd()
        return base / self.text.file
