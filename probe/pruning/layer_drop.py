"""Attention-layer importance (He et al. 2024, "What Matters in Transformers? Not All Attention Is
Needed"): a sub-layer that barely changes the residual stream can be dropped whole.

    I_l = mean over tokens of 1 - cos(x, x + attn_l(norm(x)))

with x the residual stream the sub-layer adds to (pre-LN; with post-LN the sum before the norm).
Dropping a sub-layer removes all its heads (`prune_heads` on every head of the site), leaving only
W_O's bias, if any.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from probe.data.tasks import Batch
from probe.measure.batching import micro_batches
from probe.measure.evaluate import features_batch
from probe.model import Transformer
from probe.pruning.heads import n_to_remove, present_heads

COLUMNS = ["layer", "site", "method", "value"]


@torch.no_grad()
def layer_importance(model: Transformer, batches: Sequence[Batch],
                     max_batch_tokens: int | None = None) -> pd.DataFrame:  # fmt: skip
    """1 - cos(x, x + u) per attention site, u what the sub-layer adds to the stream x
    (attn(norm(x)), through its output norm where it has one), averaged over every token of
    `batches` (run in micro-batches of `max_batch_tokens` tokens): columns layer, site, method
    ("attention-layer"), value. Sites without heads get 0."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    streams: dict[int, torch.Tensor] = {}

    def keep_stream(layer: int):
        def keep(x: torch.Tensor) -> None:
            streams[layer] = x  # [batch, seq, d_model]

        return keep

    def score(layer: int):
        def add(update: torch.Tensor) -> None:
            x = streams.pop(layer)  # [batch, seq, d_model]
            cos = F.cosine_similarity(x.double(), (x + update).double(), dim=-1)  # [batch, seq]
            sums[layer] = sums.get(layer, 0.0) + float((1 - cos).sum())
            counts[layer] = counts.get(layer, 0) + cos.numel()

        return add

    points = {}
    for attn in model.attention_modules():
        points[f"{attn.site.name}.resid_pre"] = keep_stream(attn.layer)  # the stream x
        points[f"{attn.site.name}.update"] = score(attn.layer)  # what the sub-layer adds to it
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        with model.intervene(points):
            for batch in micro_batches(batches, max_batch_tokens):
                features_batch(model, batch.to(device))
    finally:
        model.train(was_training)
    rows = [
        {"layer": s.index, "site": s.name, "method": "attention-layer",
         "value": sums.get(s.index, 0.0) / max(counts.get(s.index, 0), 1)}
        for s in model.cfg.sites()
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def plan_layers(table: pd.DataFrame, model: Transformer, fraction: float) -> list[tuple[int, int]]:
    """Every head of the round(fraction * sites) least important attention sub-layers that
    still hold heads (ties: lower layer first)."""
    present = present_heads(model)
    live = table[[bool(present[layer]) for layer in table.layer]]
    live = live.sort_values(["value", "layer"], kind="stable")
    drop = live.head(n_to_remove(fraction, len(live)))
    return [(int(layer), h) for layer in drop.layer for h in present[int(layer)]]
