"""The pruned models a healing study starts from: `fraction` of the query heads removed three ways,
each ranked by the Fisher information of the head mask on the same calibration batches:

- `fisher+tune`: heads one by one over the whole model (ragged: layers keep different counts),
  the kept heads' scales then tuned by least squares (Kwon et al. 2022's mask tuning);
- `fisher-group`: whole key/value groups (a group's query heads and its key/value head);
- `fisher-uniform`: the same number of query heads from every group of every layer.

    pruned, removed = prune_for_healing(model, batches, 1 / 3, "fisher+tune")
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.model import Transformer

METHODS = ("fisher+tune", "fisher-group", "fisher-uniform")


def prune_for_healing(
    model: Transformer, batches: Sequence[Batch], fraction: float, method: str,
    max_batch_tokens: int | None = None,
) -> tuple[Transformer, pd.DataFrame]:  # fmt: skip
    """A physically pruned copy of `model` (left unchanged) and the heads removed (layer,
    head)."""
    from probe.pruning.fisher import fisher_prune
    from probe.pruning.groups import select_units
    from probe.pruning.heads import prune_heads

    if method == "fisher+tune":
        result = fisher_prune(model, batches, fraction, max_batch_tokens=max_batch_tokens)
        pruned, removed = result.model, result.removed
    elif method not in METHODS:
        raise ProbeError(f"Unknown pruning method '{method}'; use {', '.join(METHODS)}.")
    else:
        unit, uniform = ("group", False) if method == "fisher-group" else ("head", True)
        removed = select_units(model, batches, fraction, method="fisher", unit=unit,
                               uniform=uniform, max_batch_tokens=max_batch_tokens)  # fmt: skip
        pruned = prune_heads(model, list(zip(removed["layer"], removed["head"], strict=True)))
    if len(removed) == 0:  # nothing to heal: the "healed" model would be the original
        raise ProbeError(f"removing a fraction {fraction:g} of the query heads by {method} "
                         "removes none of this model's; use a larger fraction.")  # fmt: skip
    return pruned, removed[["layer", "head"]]
