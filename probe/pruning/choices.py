"""What pruning offers by name: importance estimators, scopes and units (no torch).

The command line checks a name it is given against these before it imports torch; the modules
that do the work (`importance`, `heads`, `groups`) take their choices from here. Each importance
estimator is a module of `probe.pruning.estimators` that declares itself (`ESTIMATORS`: its
label, whether low values mark important heads, whether it runs data-parallel, what it
computes), read by the ranking, the correlations and the plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from probe.errors import ProbeError
from probe.pruning.estimators import ESTIMATORS, Estimator


def estimator(name: str) -> Estimator | None:
    """The declaration of estimator `name` (None: a curve's own method, such as fisher+tune)."""
    return ESTIMATORS.find(name)


class Scope(StrEnum):
    GLOBAL = "global"  # rank all heads together
    LAYER = "layer"  # the same fraction from every attention site


class Unit(StrEnum):
    HEAD = "head"  # query heads one by one
    GROUP = "group"  # whole key/value groups
    LAYER = "layer"  # whole attention sub-layers, by attention-layer importance (He et al. 2024)


@dataclass(frozen=True)
class CurveMethod:
    """A pruning curve's own method, beyond the head-importance estimators."""

    name: str
    label: str  # how plots name it
    help: str  # what --methods' help says of it


CURVE_METHODS = (
    CurveMethod("fisher+tune", "Fisher + mask tuning (Kwon et al.)",
                "Fisher ranking with mask tuning at every point"),  # layer by layer: tune_masks
    CurveMethod("attention-layer", "attention sub-layer 1 - cos(x, x + attn) (He et al.)",
                "whole sub-layers"),  # by their importance (He et al. 2024): layer_drop
)  # fmt: skip
CURVE_EXTRAS = tuple(m.name for m in CURVE_METHODS)


def label(method: str) -> str:
    """How plots name `method`: an estimator's or a curve method's label, else the name."""
    declared = ESTIMATORS.find(method) or next((m for m in CURVE_METHODS if m.name == method),
                                               None)  # fmt: skip
    return declared.label if declared is not None else method


def described() -> str:
    """Every estimator with what it measures, for --method's help: "gradient (|dL/dξ| of the
    head's gate, Michel et al. 2019), fisher (...), ..."."""
    return ", ".join(f"{e.name} ({e.help})" for e in ESTIMATORS)


def parse_methods(spec: str | Sequence[str]) -> list[str]:
    """Estimator names from "gradient,ablation" or a list; "all" means every estimator."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    if names == ["all"]:
        return list(ESTIMATORS.names())
    if not names:
        available = ", ".join(ESTIMATORS.names())
        raise ProbeError(f"No importance method given. Available: {available}.")
    return list(dict.fromkeys(ESTIMATORS.get(str(n)).name for n in names))
