"""The step kinds of a head study, one module each (or a few closely tied kinds in one): every
module here declares `KINDS` (what its steps compute and which steps a study plans of it) and
`SECTIONS` (the report sections presenting its tables). They are gathered here, ordered, so the
plan, the study file's table names and the report follow them; adding a step kind is one new
module in this package.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from probe.errors import ProbeError
from probe.study.heads.step import Section, StepKind
from probe.study.heads.study import HeadStudy
from probe.words import did_you_mean


def _gather() -> tuple[tuple[StepKind, ...], tuple[Section, ...]]:
    kinds: list[StepKind] = []
    sections: list[Section] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        kinds += getattr(module, "KINDS", ())
        sections += getattr(module, "SECTIONS", ())
    for things, what in ((kinds, "step kind"), (sections, "report section")):
        for attr in ("name", "order"):
            values = [getattr(t, attr) for t in things]
            twice = sorted({str(v) for v in values if values.count(v) > 1})
            if twice:
                raise ProbeError(f"two head study {what}s share the {attr} {', '.join(twice)}; "
                                 f"give each its own in {__name__}.")  # fmt: skip
    return (tuple(sorted(kinds, key=lambda k: k.order)),
            tuple(sorted(sections, key=lambda s: s.order)))  # fmt: skip


STEP_KINDS, SECTIONS = _gather()
# the tables a head study writes (tables/<name>.csv), which [[expect]] and [[contrast]] name
TABLES = tuple(k.name for k in STEP_KINDS)


def step_kind(name: str) -> StepKind:
    """The step kind called `name` (ProbeError naming the kinds there are)."""
    for kind in STEP_KINDS:
        if kind.name == name:
            return kind
    raise ProbeError(f"Unknown head study step kind '{name}'.{did_you_mean(name, list(TABLES))} "
                     f"Available: {', '.join(TABLES)}.")  # fmt: skip


def plan_steps(study: HeadStudy) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, kind, options) of every step planned from the study alone, in the order they
    run (the steps planned later, from the tables of these, come after them)."""
    return [(key, kind.name, options) for kind in STEP_KINDS for key, options in kind.plan(study)]


def step_count(study: HeadStudy) -> int:
    """How many steps a run of `study` takes."""
    later = sum(bool(k.later.expected(study)) for k in STEP_KINDS if k.later is not None)
    return len(plan_steps(study)) + later
