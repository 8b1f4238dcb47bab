"""The shape of a head study's step kinds: what a kind computes, which steps a study plans of it,
and the report sections that present its table.

Each module of `probe.study.heads.steps` declares its `KINDS` and `SECTIONS`; the package
gathers them (adding a step kind is one new module there). A kind's `name` is also the table
its steps add to (tables/<name>.csv, which [[expect]] and [[contrast]] name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from probe.report.report import MarkdownReport
from probe.study.heads.findings import Findings
from probe.study.heads.study import HeadStudy
from probe.study.heads.subject import Subject

Options = dict[str, Any]
# (subject, options, given, progress(done, total)) -> the step's table; `given`: tables the
# step may reuse instead of computing them again (not hashed, derived from earlier steps)
Compute = Callable[[Subject, Options, dict[str, pd.DataFrame], Callable[[int, int], None]],
                   pd.DataFrame]  # fmt: skip


def _no_steps(study: HeadStudy) -> list[tuple[str, Options]]:
    return []


@dataclass(frozen=True)
class Later:
    """A step planned once the others have finished (it reads their tables): `plan(study,
    tables)` gives its (options, given) or None (nothing to do); `expected(study)` says whether
    a run of `study` ends with it, for the step count."""

    plan: Callable[[HeadStudy, dict[str, pd.DataFrame]], tuple[Options, dict] | None]
    expected: Callable[[HeadStudy], bool]


@dataclass(frozen=True)
class StepKind:
    """One kind of step: `order` places its steps in the plan and its table among the study's
    tables; `plan(study)` gives the (key, options) of its steps, in the order they run; `later`:
    a kind planned after every other step finished instead (the timing of the pruned models)."""

    name: str
    order: int
    compute: Compute
    plan: Callable[[HeadStudy], list[tuple[str, Options]]] = _no_steps
    later: Later | None = None


@dataclass(frozen=True)
class Section:
    """A part of the report: `order` places it (the set-up first), `write` adds it to the
    report from the run's findings (nothing when its tables are absent)."""

    name: str
    order: int
    write: Callable[[Findings, MarkdownReport], None]
