"""The shape of a head study's step kinds: what a kind computes, which steps a study plans of it,
the study-file section it reads, the report sections that present its table, its part of the
answer and its comparisons with published work.

Each module of `probe.study.heads.steps` declares its kinds in `DECLARES`, and the package's
registry gathers them (adding a step kind, with its own section of the study file, is one new
module there). A kind's `name` is also the table its steps add to (tables/<name>.csv, which
[[expect]] and [[contrast]] name). Nothing here imports torch: the command line reads these
declarations to check a study file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probe.study.heads.study import HeadStudy, StudySection

if TYPE_CHECKING:
    import pandas as pd

    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject

__all__ = ["Claim", "Later", "Options", "Section", "StepKind", "StudySection"]

Options = dict[str, Any]
# (subject, options, given, progress(done, total)) -> the step's table; `given`: tables the
# step may reuse instead of computing them again (not hashed, derived from earlier steps)
Compute = Callable[["Subject", Options, "dict[str, pd.DataFrame]", Callable[[int, int], None]],
                   "pd.DataFrame"]  # fmt: skip


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
class Section:
    """A part of the report: `order` places it (the set-up first), `write` adds it to the
    report from the run's findings (nothing when its tables are absent)."""

    name: str
    order: int
    write: Callable[[Findings, MarkdownReport], None]


@dataclass(frozen=True)
class Claim:
    """A comparison with published work: `write(findings)` gives its bullet(s) of the report's
    "Against published work" (None or [] when the run measured nothing it needs); `order`
    places it; `cites`: the keys of `probe.references` its references list cites."""

    name: str
    order: int
    write: Callable[[Findings], str | list[str] | None]
    cites: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepKind:
    """One kind of step: `order` places its steps in the plan and its table among the study's
    tables; `plan(study)` gives the (key, options) of its steps, in the order they run; `later`:
    a kind planned after every other step finished instead (the timing of the pruned models).
    `section`: the study-file section its options come from; `reports`: the report sections
    presenting its table; `answer(findings)`: its sentence of the report's answer (None: none);
    `claims`: its comparisons with published work."""

    name: str
    order: int
    compute: Compute
    plan: Callable[[HeadStudy], list[tuple[str, Options]]] = _no_steps
    later: Later | None = None
    section: StudySection | None = None
    reports: tuple[Section, ...] = ()
    answer: Callable[[Findings], str | None] | None = None
    claims: tuple[Claim, ...] = ()
