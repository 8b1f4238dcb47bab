"""What a grid study is, once its file is read: the `Study` and its parts (variants, conditional
overrides, the published reference). `spec.py` reads study files into these; `cells.py` expands
them into cells."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.study.verdicts.contrast import Contrast
from probe.study.verdicts.expect import Expectation


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]  # dotted key ("train.random_positions") -> value
    description: str = ""


@dataclass(frozen=True)
class Override:
    """Settings applied to every cell whose configuration matches `where` (for example a shorter
    training range for one task)."""

    where: dict[str, tuple[Any, ...]]  # dotted key -> the values that match
    overrides: dict[str, Any]  # dotted key -> value


@dataclass(frozen=True)
class Reference:
    """The published result to compare with: an entry of the project's references file
    (`probe/references.toml`), and which of our numbers to compare with it."""

    id: str  # the entry's id in the references file
    metric: str = "exact_match"
    lengths: str = "unseen"  # which lengths of ours to compare: "unseen" (> L) or "seen"
    notes: str = ""  # how this study's set-up differs from the paper's


@dataclass(frozen=True)
class Study:
    name: str
    question: str
    path: Path | None
    base: dict[str, dict[str, Any]]  # "model"/"task"/"train" -> settings
    grid: dict[str, tuple[Any, ...]]  # dotted key -> values, crossed in file order
    variants: tuple[Variant, ...] = ()
    overrides: tuple[Override, ...] = ()
    analysis: dict[str, Any] = field(default_factory=dict)  # step name -> options, in run order
    expectations: tuple[Expectation, ...] = ()
    by: str = "model.pe"  # the factor the report compares (variants show under their name)
    title: str = ""
    description: str = ""
    reference: Reference | None = None
    contrasts: tuple[Contrast, ...] = ()  # claims tested over seeds (the report's verdicts)
    smoke: dict[str, Any] | None = None  # the raw [smoke] table, applied by `smoke_version`
    is_smoke: bool = False

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else f"study '{self.name}'"
