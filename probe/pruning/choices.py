"""What pruning offers by name: importance estimators, scopes and units (no torch).

The command line checks a name it is given against these before it imports torch; the modules
that do the work (`importance`, `heads`, `groups`) take their choices from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from probe.config import choice
from probe.errors import ProbeError


class Method(StrEnum):
    GRADIENT = "gradient"
    FISHER = "fisher"
    ABLATION = "ablation"
    MEAN_ABLATION = "mean-ablation"
    CONFIDENCE = "confidence"
    ENTROPY = "entropy"
    RANDOM = "random"


class Scope(StrEnum):
    GLOBAL = "global"  # rank all heads together
    LAYER = "layer"  # the same fraction from every attention site


class Unit(StrEnum):
    HEAD = "head"  # query heads one by one
    GROUP = "group"  # whole key/value groups
    LAYER = "layer"  # whole attention sub-layers, by attention-layer importance (He et al. 2024)


# curve methods beyond the head-importance estimators: Fisher ranking with mask tuning at every
# point (Kwon et al. 2022, layer by layer: `tune_masks`), and whole attention sub-layers by their
# importance (He et al. 2024)
CURVE_EXTRAS = ("fisher+tune", "attention-layer")


def parse_methods(spec: str | Sequence[str]) -> list[str]:
    """Estimator names from "gradient,ablation" or a list; "all" means every estimator."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    if names == ["all"]:
        return [str(m) for m in Method]
    if not names:
        raise ProbeError(f"No importance method given. Available: {', '.join(Method)}.")
    return list(dict.fromkeys(str(choice(Method, n, "importance method")) for n in names))
