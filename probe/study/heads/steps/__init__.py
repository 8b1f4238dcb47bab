"""The step kinds of a head study, one module each (or a few closely tied kinds in one): every
module here declares its `StepKind`s in `DECLARES`: what its steps compute, which steps a study
plans of it, the study-file section it reads, the report sections presenting its tables, its
part of the answer and its claims. `KINDS` gathers them in their order, so the plan, the study
file's sections and table names, the checks, the report and the answer follow them; adding a
step kind is one new module in this package. Reading the declarations imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError
from probe.registry import Registry
from probe.study.heads.step import Claim, Section, StepKind
from probe.study.heads.study import OPERATING, TEXT, HeadStudy, StudySection

if TYPE_CHECKING:
    from probe.study.heads.subject import Subject

KINDS: Registry[StepKind] = Registry("head study step kind", __name__, order="order")


def _ordered(things: list[Any], what: str) -> tuple[Any, ...]:
    """`things` by their order, once no two share a name or an order."""
    for attr in ("name", "order"):
        values = [getattr(t, attr) for t in things]
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise ProbeError(f"two head study {what}s share the {attr} {', '.join(twice)}; "
                             f"give each its own in {__name__}.")  # fmt: skip
    return tuple(sorted(things, key=lambda t: t.order))


def step_kinds() -> tuple[StepKind, ...]:
    """Every step kind, in order (their order also checked for repeats)."""
    return _ordered(list(KINDS), "step kind")


def report_sections() -> tuple[Section, ...]:
    """The report sections of every step kind, in the report's order."""
    return _ordered([s for k in KINDS for s in k.reports], "report section")


def claims() -> tuple[Claim, ...]:
    """The comparisons with published work of every step kind, in the report's order."""
    return _ordered([c for k in KINDS for c in k.claims], "claim")


RESERVED = ("study", "model", "expect", "contrast", "smoke")  # a head study file's own tables


def study_sections() -> tuple[StudySection, ...]:
    """The sections of a head study file, in order: [text], those the step kinds read (a
    section several kinds read counted once), [operating]."""
    found: dict[str, StudySection] = {}
    for kind in KINDS:
        s = kind.section
        if s is not None and s.name in RESERVED:
            raise ProbeError(f"the {kind.name} step kind's section is called '{s.name}', "
                             "a table every head study file has; name it otherwise.")  # fmt: skip
        if s is not None and found.setdefault(s.name, s) is not s:
            raise ProbeError(f"two head study sections are called '{s.name}'; let the kinds "
                             f"that read it share one declaration in {__name__}.")  # fmt: skip
    return _ordered([TEXT, *found.values(), OPERATING], "section")


def table_names() -> tuple[str, ...]:
    """The tables a head study writes (tables/<name>.csv), which [[expect]] and [[contrast]]
    name: one per step kind."""
    return tuple(k.name for k in step_kinds())


def step_kind(name: str) -> StepKind:
    """The step kind called `name` (ProbeError naming the kinds there are)."""
    return KINDS.get(name)


def plan_steps(study: HeadStudy) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, kind, options) of every step planned from the study alone, in the order they
    run (the steps planned later, from the tables of these, come after them)."""
    return [(key, kind.name, options) for kind in step_kinds() if _on(kind, study)
            for key, options in kind.plan(study)]  # fmt: skip


def _on(kind: StepKind, study: HeadStudy) -> bool:
    """Whether the study's file lets the kind plan steps: a section that turns its steps on
    must be there."""
    s = kind.section
    return s is None or not s.turns_on or s.name in study.given


def step_count(study: HeadStudy) -> int:
    """How many steps a run of `study` takes."""
    later = sum(bool(k.later.expected(study)) for k in step_kinds()
                if k.later is not None and _on(k, study))  # fmt: skip
    return len(plan_steps(study)) + later


def check_fit(subject: Subject) -> None:
    """What the study asks of its model, once the model is imported: what no one section
    owns (`checks.check_model_fit`), then each section's own `fit`. Run before the first step
    is computed, so nothing fails after minutes of work."""
    from probe.study.heads.checks import check_model_fit

    check_model_fit(subject)
    for section in study_sections():
        if section.fit is not None:
            section.fit(subject)
