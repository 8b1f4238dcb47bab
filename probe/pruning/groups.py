"""Pruning that respects grouped-query attention, and uniform pruning that a fixed-shape format
(a Hugging Face Llama config) can express.

With grouped-query attention the n_head query heads of a site share n_kv_head key/value heads in
groups of n_head / n_kv_head. A unit of removal is either a query head (its key/value head goes
only when no query head reads it any more: `Attention.prune`) or a whole group (the key/value
head and every query head that reads it). A group's importance is the sum of its query heads'
importances (ablation, gradient and the attention statistics are all scored per head).

uniform=True removes the same number of units everywhere: the same number of query heads from
every key/value group of every layer (unit head; without grouped-query attention, from every
layer), or the same number of groups from every layer
(unit group), so every layer keeps one shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.fields import choice
from probe.model import Transformer
from probe.pruning.choices import Unit  # re-exported: its old home
from probe.pruning.heads import n_to_remove, present_heads, ranking
from probe.pruning.importance import head_importance
from probe.pruning.layer_drop import layer_importance, plan_layers

COLUMNS = ["step", "layer", "head", "method", "value"]


def group_table(table: pd.DataFrame, model: Transformer) -> pd.DataFrame:
    """layer, group, score (larger = more important): summed over each group's query heads."""
    rank = ranking(table)
    sites = {s.index: s for s in model.cfg.sites()}
    rank["group"] = [sites[layer].group(head) for layer, head in zip(rank.layer, rank["head"],
                                                                     strict=True)]  # fmt: skip
    return rank.groupby(["layer", "group"], as_index=False)["score"].sum()


def plan_units(
    table: pd.DataFrame, model: Transformer, fraction: float, unit: Unit | str, uniform: bool
) -> list[tuple[int, int]]:
    """(layer, head) pairs to remove: `fraction` of the units present, least important first."""
    unit = choice(Unit, unit, "pruning unit")
    present = present_heads(model)
    sites = model.cfg.sites()
    rank = ranking(table).sort_values(["score", "layer", "head"], kind="stable")
    chosen: list[tuple[int, int]] = []
    if unit == Unit.HEAD:
        if not uniform:
            raise ValueError("head units without uniform are plan_removal's job")
        for site, heads in zip(sites, present, strict=True):
            # the same share of every key/value group; without GQA (a group per head) of the layer
            pools = [list(heads)]
            if site.grouped:
                groups = sorted({site.group(h) for h in heads})
                pools = [[h for h in heads if site.group(h) == g] for g in groups]
            for members in pools:
                rows = rank[(rank.layer == site.index) & rank["head"].isin(members)]
                k = n_to_remove(fraction, len(members))
                chosen += [(site.index, int(h)) for h in rows["head"].head(k)]
        return chosen
    groups = group_table(table, model)
    live = {(s.index, s.group(h)) for s, heads in zip(sites, present, strict=True) for h in heads}
    groups = groups[[(r.layer, r.group) in live for r in groups.itertuples()]]
    groups = groups.sort_values(["score", "layer", "group"], kind="stable")
    if uniform:
        picked = []
        for site in sites:
            mine = groups[groups.layer == site.index]
            picked += list(mine.head(n_to_remove(fraction, len(mine))).itertuples())
    else:
        picked = list(groups.head(n_to_remove(fraction, len(groups))).itertuples())
    for r in picked:
        site = sites[int(r.layer)]
        chosen += [(site.index, h) for h in present[site.index] if site.group(h) == r.group]
    return chosen


def select_units(
    model: Transformer,
    batches: Sequence[Batch],
    fraction: float,
    *,
    method: str = "gradient",
    unit: Unit | str = Unit.HEAD,
    uniform: bool = False,
    normalize: bool = False,
    seed: int = 0,
    progress=None,
    max_batch_tokens: int | None = None,
    **ignored,
) -> pd.DataFrame:
    """One-shot selection by units (columns as `select_heads`): importance on `batches` (in
    micro-batches of `max_batch_tokens` tokens), then `plan_units`. The model's gates are left
    as they were."""
    if ignored.get("iterative"):
        raise ProbeError("--iterative works with --unit head without --uniform only.")
    if ignored.get("min_heads_per_layer", 0):
        raise ProbeError("--min-heads-per-layer works with --unit head without --uniform only.")
    if ignored.get("scope", "global") != "global":
        raise ProbeError("--scope layer and --uniform/--unit group do not combine; use one.")
    if choice(Unit, unit, "pruning unit") == Unit.LAYER:
        if uniform:
            raise ProbeError("--uniform and --unit layer do not combine; use one.")
        layers = layer_importance(model, batches, max_batch_tokens)
        chosen = plan_layers(layers, model, fraction)
        values = layers.set_index("layer")["value"]
        rows = [{"step": 0, "layer": a, "head": b, "method": "attention-layer",
                 "value": values[a]} for a, b in chosen]  # fmt: skip
        return pd.DataFrame(rows, columns=COLUMNS)
    table = head_importance(model, batches, method, normalize=normalize, seed=seed,
                            progress=progress, max_batch_tokens=max_batch_tokens)  # fmt: skip
    chosen = plan_units(table, model, fraction, unit, uniform)
    values = table.set_index(["layer", "head"])["value"]
    rows = [{"step": 0, "layer": a, "head": b, "method": str(method), "value": values[(a, b)]}
            for a, b in chosen]  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
