"""The analyses a grid study runs on each trained model: one module per step, found here.

Each step module declares `STEP = Step(...)` (`base.py`): its options dataclass, its run function
(the trained model and the cell's configs in a `StepContext`, plus its validated options, in;
tidy DataFrames by table name out), more checks of its options, and the report sections that
present its tables. This package imports every module in it (pkgutil) and registers the `STEP`s
it finds, so adding a step is adding one file; a module without `STEP` holds shared helpers.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import pkgutil
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

from probe.errors import ProbeError
from probe.fields import from_dict
from probe.study.grid.steps.base import Given, Section, Step, StepContext, resolve_lengths
from probe.words import did_you_mean

__all__ = [
    "SECTIONS", "STEPS", "Given", "Section", "Step", "StepContext", "discover", "get_step",
    "options_dict", "ordered", "parse_options", "resolve_lengths",
]  # fmt: skip


def discover(package: str, path: Iterable[str]) -> dict[str, Step]:
    """Every `STEP` declared by a module of `package` (found on `path`), by name."""
    found: dict[str, Step] = {}
    for info in pkgutil.iter_modules(path):
        step = getattr(importlib.import_module(f"{package}.{info.name}"), "STEP", None)
        if step is None:
            continue
        if step.name in found:
            raise ProbeError(f"two analysis steps are named '{step.name}'; rename one.")
        found[step.name] = step
    return dict(sorted(found.items()))


def ordered(steps: dict[str, Step]) -> tuple[Section, ...]:
    """Every step's report sections in the report's order; places and names are unique."""
    sections = sorted((s for step in steps.values() for s in step.sections), key=lambda s: s.place)
    for a, b in itertools.pairwise(sections):
        if a.place == b.place:
            raise ProbeError(f"report sections '{a.name}' and '{b.name}' share place {a.place}.")
    names = [s.name for s in sections]
    if len(set(names)) != len(names):
        raise ProbeError(f"two report sections share a name: {sorted(names)}.")
    return tuple(sections)


STEPS: MappingProxyType[str, Step] = MappingProxyType(discover(__name__, __path__))
SECTIONS: tuple[Section, ...] = ordered(dict(STEPS))  # the report's order


def get_step(name: str) -> Step:
    if name not in STEPS:
        raise ProbeError(
            f"Unknown analysis '{name}'.{did_you_mean(name, list(STEPS))} "
            f"Available: {', '.join(STEPS)}."
        )
    return STEPS[name]


def parse_options(name: str, raw: dict[str, Any]) -> Any:
    """Validated options of step `name` from a study file's [analysis.NAME] table."""
    step = get_step(name)
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(raw).items()}
    options = from_dict(step.options, data, f"analysis.{name}")
    if hasattr(options, "lengths"):
        resolve_lengths(options.lengths, 16)  # fail now on a malformed spec, not mid-study
    if step.check is not None:
        step.check(options)
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.name in ("batch_size", "n_batches", "splits") and (
            not isinstance(value, int) or value < 1
        ):
            raise ProbeError(
                f"[analysis.{name}] {f.name} must be a whole number >= 1, got {value!r}."
            )
    return options


def options_dict(options: Any) -> dict[str, Any]:
    """JSON-ready options (for hashing and the manifest). An option named in the options'
    `added_later` is left out at its default, so cells computed before it existed keep their
    keys."""
    later = getattr(options, "added_later", ())
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(options).items()
        if not (k in later and v == defaults[k])
    }
