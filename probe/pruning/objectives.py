"""Which metric a model is scored by: its objective's primary metric and direction, in one place.

Pruning curves, operating points, a head study's steps, evidence and report, the grid studies'
pruning section and `probe prune` all read a model by the metric named here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import pandas as pd

TASK = "task"  # the objective of a model trained on a synthetic task (batches carry None)


class Primary(NamedTuple):
    metric: str  # the row of a curve's metric column the model is read by
    higher: bool  # whether a larger value is better


PRIMARY = {
    TASK: Primary("exact_match", True),
    "embedding": Primary("similarity", True),  # cosine similarity to the unpruned embeddings
    "causal-lm": Primary("loss", False),
    "masked-lm": Primary("loss", False),
}


def primary(objective: str | None) -> Primary:
    """The primary metric of `objective` (None: a synthetic task)."""
    return PRIMARY[TASK if objective is None else objective]


def objective_of(metrics: Iterable[str]) -> str:
    """The objective a table of these metric names was scored for: the one whose primary metric
    is among them (loss stands for a language model, causal or masked alike)."""
    names = set(metrics)
    for objective in ("embedding", TASK):
        if PRIMARY[objective].metric in names:
            return objective
    return "causal-lm"


def operating_points(curves: pd.DataFrame, objective: str, tolerance: float) -> pd.DataFrame:
    """Per method, unit and seed: the largest share of heads removed such that the primary metric
    at it and at every smaller share stays within `tolerance` of the unpruned model's. Columns
    method, unit, seed, metric, fraction, n_pruned, value, reference."""
    metric, higher = primary(objective)
    rows = []
    data = curves[curves.metric == metric].sort_values("fraction", kind="stable")
    for (method, unit, seed), g in data.groupby(["method", "unit", "seed"], sort=False):
        reference = float(g[g.n_pruned == 0].value.iloc[0]) if (g.n_pruned == 0).any() else None
        best = None
        if reference is not None:
            for r in g.itertuples():
                gap = reference - r.value if higher else r.value - reference
                if gap > tolerance + 1e-12:
                    break
                best = r
        rows.append({"method": method, "unit": unit, "seed": int(seed), "metric": metric,
                     "fraction": None if best is None else float(best.fraction),
                     "n_pruned": None if best is None else int(best.n_pruned),
                     "value": None if best is None else float(best.value),
                     "reference": reference})  # fmt: skip
    return pd.DataFrame(rows)
