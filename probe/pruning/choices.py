"""What pruning offers by name: importance estimators, scopes and units (no torch).

The command line checks a name it is given against these before it imports torch; the modules
that do the work (`importance`, `heads`, `groups`) take their choices from here, and each
estimator's declaration (`ESTIMATORS`: its label, whether low values mark important heads,
whether it runs data-parallel) is read by the ranking, the correlations and the plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from probe.errors import ProbeError
from probe.fields import choice


class Method(StrEnum):
    GRADIENT = "gradient"
    FISHER = "fisher"
    ABLATION = "ablation"
    MEAN_ABLATION = "mean-ablation"
    CONFIDENCE = "confidence"
    ENTROPY = "entropy"
    RANDOM = "random"


@dataclass(frozen=True)
class Estimator:
    """What the rest of probe needs to know of an importance estimator."""

    label: str  # how plots name it
    low_is_important: bool = False  # its lowest values mark the heads that matter (entropy)
    data_parallel: bool = False  # its per-head sums add over processes (torchrun)
    gradients: bool = False  # it differentiates the loss (zero for a self-similarity encoder)


ESTIMATORS: dict[Method, Estimator] = {
    Method.GRADIENT: Estimator("gradient |dL/dξ| (Michel et al.)", data_parallel=True,
                               gradients=True),
    Method.FISHER: Estimator("Fisher (dL/dξ)² (Kwon et al.)", data_parallel=True,
                             gradients=True),
    Method.ABLATION: Estimator("ablation (Δ loss, gate 0)"),
    Method.MEAN_ABLATION: Estimator("mean ablation (Δ loss)"),
    Method.CONFIDENCE: Estimator("confidence (mean max weight)"),
    Method.ENTROPY: Estimator("attention entropy (nats)", low_is_important=True),
    Method.RANDOM: Estimator("random"),
}  # fmt: skip


def estimator(name: str) -> Estimator | None:
    """The declaration of estimator `name` (None: a curve's own method, such as fisher+tune)."""
    return ESTIMATORS.get(name)  # a StrEnum key is found by its string


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
