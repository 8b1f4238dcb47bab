"""What `probe prune --sweep` runs: the pruning curve, and the scoring every pruning run shares
(`probe.pruning.compare` prunes one fraction physically and compares).

`pruning_curve` gives a metric against the fraction of heads pruned, per
estimator and seed. Along the curve heads are removed by masking (gate 0), which gives the same
logits as physical pruning (`prune_heads`) at a fraction of the cost. Seed r draws importance
split r (disjoint from the scoring data) and seeds the random baseline, so the spread over seeds
shows how much a ranking depends on the data it was estimated on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import torch

from probe.data.tasks import Batch, score
from probe.errors import ProbeError
from probe.measure.batching import micro_batches
from probe.measure.evaluate import batch_loss, forward_batch, text_metrics
from probe.model import Transformer
from probe.pruning.choices import CURVE_EXTRAS  # re-exported: its old home
from probe.pruning.fisher import tune_masks
from probe.pruning.groups import plan_units
from probe.pruning.heads import (
    check_counts,
    head_mask,
    plan_removal,
    present_heads,
    quota,
)
from probe.pruning.importance import head_importance
from probe.pruning.layer_drop import layer_importance, plan_layers
from probe.pruning.objectives import primary
from probe.schema import CURVE_COLUMNS
from probe.words import counted

Progress = Callable[[int, int], None]


@torch.no_grad()
def score_batches(model: Transformer, batches: Sequence[Batch],
                  max_batch_tokens: int | None = None) -> dict[str, float]:  # fmt: skip
    """exact_match, token_accuracy and loss, each a mean over every example of `batches`; for an
    imported model's text batches what fits its objective (`text_metrics`). The batches run in
    micro-batches of `max_batch_tokens` tokens."""
    if batches and batches[0].objective is not None:
        return score_text(model, batches, max_batch_tokens)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sums = {"exact_match": 0.0, "token_accuracy": 0.0, "loss": 0.0}
    n = 0
    try:
        for batch in micro_batches(batches, max_batch_tokens):
            batch = batch.to(device)
            logits = forward_batch(model, batch)  # [batch, seq, vocab]
            exact, tokens = score(logits, batch)
            loss = batch_loss(model, batch, "none", logits=logits)  # [batch]
            sums["exact_match"] += exact.float().sum().item()
            sums["token_accuracy"] += tokens.sum().item()
            sums["loss"] += loss.double().sum().item()
            n += exact.numel()
    finally:
        model.train(was_training)
    return {k: v / max(n, 1) for k, v in sums.items()}


@torch.no_grad()
def score_text(model: Transformer, batches: Sequence[Batch],
               max_batch_tokens: int | None = None) -> dict[str, float]:  # fmt: skip
    """Language models: loss and perplexity over the scored tokens, and token accuracy;
    sentence encoders: mean cosine similarity to the reference embeddings."""
    was_training = model.training
    model.eval()
    try:
        objective = batches[0].objective
        metrics = text_metrics(model, batches, objective, True, max_batch_tokens)
        if objective == "embedding":
            return {k: metrics[k] for k in ("similarity", "neighbours") if k in metrics}
        return {k: metrics[k] for k in ("token_accuracy", "loss", "perplexity")}
    finally:
        model.train(was_training)


def primary_metric(batches: Sequence[Batch]) -> str:
    """The metric a pruning curve is read by: exact match on tasks, loss on text (similarity for
    sentence encoders)."""
    return primary(batches[0].objective if batches else None).metric


def default_fractions(n_heads: int) -> list[float]:
    """Every head count 0..n when there are at most 24 heads, else eleven steps of 0.1."""
    if n_heads <= 24:
        return [k / n_heads for k in range(n_heads + 1)]
    return [k / 10 for k in range(11)]


def _extra_points(model, method: str, split, scoring, fractions, n_heads: int, unit: str = "head",
                  seed: int = 0, budget: int | None = None):  # fmt: skip
    """(fraction, metrics, n_pruned) for each fraction, for one of CURVE_EXTRAS on one split, or
    for any estimator by key/value group (unit "group": `fraction` is then the share of groups,
    the recorded fraction the share of heads they held)."""
    present = present_heads(model)
    scales = None
    if unit == "group" and method not in CURVE_EXTRAS:
        table = head_importance(model, split, method, seed=seed, max_batch_tokens=budget)
        plans = [plan_units(table, model, f, "group", uniform=False) for f in fractions]
    elif method == "attention-layer":
        layers = layer_importance(model, split, budget)
        plans = [plan_layers(layers, model, f) for f in fractions]
    else:
        table = head_importance(model, split, "fisher", max_batch_tokens=budget)
        plans = [plan_removal(table, present, quota(present, f, "global")) for f in fractions]
        scales = [tune_masks(model, plan, split, max_batch_tokens=budget) for plan in plans]
    before = [g.detach().clone() for g in model.gates()]
    points = []
    seen = set()
    for i, plan in enumerate(plans):
        key = tuple(sorted(plan))
        if key in seen:
            continue
        seen.add(key)
        gates = head_mask(model, plan) if scales is None else [
            s.to(g.dtype) for s, g in zip(scales[i], before, strict=True)
        ]  # fmt: skip
        model.set_gates(gates)
        points.append((len(plan) / n_heads, score_batches(model, scoring, budget), len(plan)))
        model.set_gates(before)
    return points


def pruning_curve(
    model: Transformer,
    importance_splits: Sequence[Sequence[Batch]],
    scoring: Sequence[Batch],
    methods: Sequence[str],
    fractions: Sequence[float] | None = None,
    *,
    iterative: bool = False,
    scope: str = "global",
    min_heads_per_layer: int = 0,
    normalize: bool = False,
    unit: str = "head",
    seeds: Sequence[int] | None = None,
    progress: Progress | None = None,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Metrics on `scoring` after pruning each fraction of heads: the curve schema
    (`probe.schema.CURVE_COLUMNS`: fraction, method, seed, metric, value, n_pruned,
    unit). One seed per importance split: `seeds` (default 0, 1, ...) labels them and seeds
    the random baseline.

    unit "group" removes whole key/value groups (one shot, global ranking by the summed
    importance of their heads); `fractions` are then shares of the groups.

    One-shot ranks heads once per (method, seed); iterative re-estimates importance on the masked
    model before each further fraction. `fraction` is the share of heads actually removed.
    The model's gates are restored afterwards. Every forward (and backward) pass holds at most
    `max_batch_tokens` tokens (micro-batches; None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`).
    """
    present = present_heads(model)
    n_heads = sum(len(h) for h in present)
    if n_heads == 0:
        raise ProbeError("The model has no attention heads left to prune.")
    if not methods or not importance_splits:
        raise ProbeError("A pruning curve needs at least one method and one seed.")
    fractions = sorted(set(default_fractions(n_heads) if fractions is None else fractions))
    counts = []  # one entry per distinct head count (layer quotas can merge fractions)
    for f in fractions:
        c = quota(present, f, scope)
        if c not in counts:
            counts.append(c)
    for c in counts:
        check_counts(present, c, min_heads_per_layer)
    seeds = list(range(len(importance_splits))) if seeds is None else list(seeds)
    if len(seeds) != len(importance_splits):
        raise ProbeError(
            f"{counted(len(importance_splits), 'importance split')} but "
            f"{counted(len(seeds), 'seed')}."
        )
    rows = []
    total, done = len(methods) * len(importance_splits) * len(counts), 0
    before = [g.detach().clone() for g in model.gates()]
    try:
        for method in methods:
            for seed, split in zip(seeds, importance_splits, strict=True):
                model.set_gates(before)
                if method in CURVE_EXTRAS or unit == "group":
                    if unit == "group" and (method in CURVE_EXTRAS or iterative):
                        raise ProbeError(
                            "A curve by key/value group is one-shot, from a head estimator."
                        )
                    for fraction, metrics, n_pruned in _extra_points(
                        model, method, split, scoring, fractions, n_heads, unit, seed,
                        max_batch_tokens,
                    ):  # fmt: skip
                        rows += [{"fraction": fraction, "method": method, "seed": seed,
                                  "metric": k, "value": v, "n_pruned": n_pruned}
                                 for k, v in metrics.items()]  # fmt: skip
                    done += len(counts)
                    if progress is not None:
                        progress(done, total)
                    continue
                table, removed = None, []
                for count in counts:
                    if table is None or iterative:
                        table = head_importance(
                            model, split, method, normalize=normalize, seed=seed,
                            max_batch_tokens=max_batch_tokens,
                        )  # fmt: skip
                    more = _difference(count, removed, present)
                    if not _empty(more):
                        chosen = plan_removal(
                            table,
                            present_heads(model),
                            more,
                            min_heads_per_layer=min_heads_per_layer,
                        )
                        removed += chosen
                        model.set_gates(head_mask(model, chosen))
                    metrics = score_batches(model, scoring, max_batch_tokens)
                    rows += [
                        {
                            "fraction": len(removed) / n_heads,
                            "method": str(method),
                            "seed": seed,
                            "metric": name,
                            "value": value,
                            "n_pruned": len(removed),
                        }
                        for name, value in metrics.items()
                    ]
                    done += 1
                    if progress is not None:
                        progress(done, total)
    finally:
        model.set_gates(before)
    return pd.DataFrame(rows, columns=CURVE_COLUMNS[:-1]).assign(unit=unit)


def _difference(
    count: int | list[int], removed: list[tuple[int, int]], present: list[tuple[int, ...]]
) -> int | list[int]:
    """Heads still to remove to reach `count` (global or per layer), given `removed`."""
    if isinstance(count, int):
        return count - len(removed)
    per_layer = [sum(1 for layer, _ in removed if layer == i) for i in range(len(present))]
    return [c - r for c, r in zip(count, per_layer, strict=True)]


def _empty(count: int | list[int]) -> bool:
    return count == 0 if isinstance(count, int) else not any(count)
