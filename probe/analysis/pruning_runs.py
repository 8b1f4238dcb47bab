"""What `probe prune` runs: a pruned model compared with the original, and the pruning curve.

`prune_and_compare` picks heads on an importance split, prunes them physically and reports the
original, masked and pruned models side by side: metrics on a disjoint scoring split, parameter
counts and forward time. `pruning_curve` gives a metric against the fraction of heads pruned, per
estimator and seed. Along the curve heads are removed by masking (gate 0), which gives the same
logits as physical pruning (`prune_heads`) at a fraction of the cost. Seed r draws importance
split r (disjoint from the scoring data) and seeds the random baseline, so the spread over seeds
shows how much a ranking depends on the data it was estimated on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from probe.analysis.fisher import fisher_prune, tune_masks
from probe.analysis.groups import plan_units, select_units
from probe.analysis.importance import head_importance
from probe.analysis.layer_drop import layer_importance, plan_layers
from probe.analysis.pruning import (
    check_counts,
    head_mask,
    plan_removal,
    present_heads,
    prune_heads,
    quota,
    select_heads,
)
from probe.analysis.timing import COLUMNS as TIMING_COLUMNS
from probe.analysis.timing import Gated, time_forward, timing_batches
from probe.batching import micro_batches, split_batch
from probe.errors import ProbeError
from probe.evaluate import batch_loss, features_batch, forward_batch, text_metrics
from probe.loss import LOSS_CHUNK
from probe.memory import model_bytes, room_for
from probe.model import Transformer
from probe.tasks import Batch, score
from probe.words import counted

Progress = Callable[[int, int], None]
COLUMNS = ["fraction", "method", "seed", "metric", "value"]


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
    objective = batches[0].objective if batches else None
    return {None: "exact_match", "embedding": "similarity"}.get(objective, "loss")


def default_fractions(n_heads: int) -> list[float]:
    """Every head count 0..n when there are at most 24 heads, else eleven steps of 0.1."""
    if n_heads <= 24:
        return [k / n_heads for k in range(n_heads + 1)]
    return [k / 10 for k in range(11)]


# curve methods beyond the head-importance estimators: Fisher ranking with mask tuning at every
# point (Kwon et al. 2022, layer by layer: `tune_masks`), and whole attention sub-layers by their
# importance (He et al. 2024)
CURVE_EXTRAS = ("fisher+tune", "attention-layer")


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
    """Metrics on `scoring` after pruning each fraction of heads: tidy columns fraction, method,
    seed, metric, value (plus n_pruned). One seed per importance split: `seeds` (default 0, 1,
    ...) labels them and seeds the random baseline.

    unit "group" removes whole key/value groups (one shot, global ranking by the summed
    importance of their heads); `fractions` are then shares of the groups.

    One-shot ranks heads once per (method, seed); iterative re-estimates importance on the masked
    model before each further fraction. `fraction` is the share of heads actually removed.
    The model's gates are restored afterwards. Every forward (and backward) pass holds at most
    `max_batch_tokens` tokens (micro-batches; None: `probe.batching.DEFAULT_BATCH_TOKENS`).
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
    return pd.DataFrame(rows, columns=[*COLUMNS, "n_pruned"])


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


Phase = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class PruneComparison:
    model: Transformer  # the physically pruned model
    removed: pd.DataFrame  # step, layer, head, method, value
    metrics: pd.DataFrame  # variant (original, masked, pruned), metric, value
    parameters: pd.DataFrame  # variant, part (attention, cross-attention, ..., total), count
    timing: pd.DataFrame  # variant, batch_size, part, seconds, ... (empty without timing)
    max_logit_gap: float  # max |pruned logits - masked logits| on the first scoring micro-batch
    work_seconds: float = 0.0  # what choosing, pruning and scoring took
    timing_budget: float | None = None  # seconds the timing was given (None: no budget)
    timing_seconds: float = 0.0  # what the timing took
    in_place: bool = False  # the input model was pruned in place (no copy fitted beside it)


def parameter_table(variants: dict[str, Transformer]) -> pd.DataFrame:
    rows = [
        {"variant": name, "part": part, "count": count}
        for name, model in variants.items()
        for part, count in model.parameter_counts().items()
    ]
    return pd.DataFrame(rows, columns=["variant", "part", "count"])


def _fisher_options(select: dict) -> dict:
    """Mask tuning runs on the Fisher ranking, one shot, global budget: anything else is refused."""
    if select.get("method", "fisher") != "fisher":
        raise ProbeError("--tune tunes the mask Fisher search chose; use it with --method fisher.")
    for key, default in (("iterative", False), ("scope", "global"), ("min_heads_per_layer", 0),
                         ("normalize", False)):  # fmt: skip
        if select.get(key, default) != default:
            flag = "--" + key.replace("_", "-")
            raise ProbeError(f"--tune does not combine with {flag}; drop one of them.")
    return {}


def prune_and_compare(
    model: Transformer,
    importance: Sequence[Batch],
    scoring: Sequence[Batch],
    fraction: float,
    *,
    timing: bool = True,
    batch_sizes: Sequence[int] = (1, 16, 64),
    repeats: int = 10,
    threads: int | None = None,
    timing_budget: float | None = None,
    timing_share: float | None = None,
    max_batch_tokens: int | None = None,
    in_place: bool | None = False,
    progress: Phase | None = None,
    **select,
) -> PruneComparison:
    """Prune `fraction` of the heads chosen on `importance` (keywords as `select_heads`), then
    score original, masked and pruned models on `scoring` and time their forward passes on the
    longest scoring batch. The masked model is the input model run with the removed heads'
    gates at 0 (`Gated`), not a copy of its weights.

    The input model is left unchanged, unless `in_place` (None: when a pruned copy would not
    fit beside it, `probe.memory.room_for`): then it is scored and timed first, pruned in place
    (it becomes the result's model: no second copy of the weights), and the pruned model scored
    and timed after it, not interleaved with it. Mask tuning (`tune`) prunes a copy.

    Every pass holds at most `max_batch_tokens` tokens (micro-batches). The timing takes at
    most `timing_budget` seconds, or `timing_share` times what choosing, pruning and scoring
    took (neither: `repeats` exactly at every size; `time_forward`)."""
    started = time.perf_counter()

    def phase(name: str):
        return None if progress is None else (lambda done, total: progress(name, done, total))

    unit, uniform = select.pop("unit", "head"), select.pop("uniform", False)
    tune = select.pop("tune", False)
    budget = max_batch_tokens
    before = [g.detach().clone() for g in model.gates()]
    pruned = None
    if tune:  # Fisher mask search + mask tuning: the masked model runs with the tuned scales
        if in_place:
            raise ProbeError("Mask tuning prunes a copy of the model; it cannot prune in place.")
        result = fisher_prune(model, importance, fraction, progress=phase("importance"),
                              max_batch_tokens=budget, **_fisher_options(select))  # fmt: skip
        removed, pruned = result.removed, result.model
        gates = [s.to(g.dtype) for s, g in zip(result.scales, before, strict=True)]
        in_place = False
    else:
        if str(unit) != "head" or uniform:
            removed = select_units(model, importance, fraction, unit=unit, uniform=uniform,
                                   progress=phase("importance"), max_batch_tokens=budget,
                                   **select)  # fmt: skip
        else:
            removed = select_heads(model, importance, fraction, progress=phase("importance"),
                                   max_batch_tokens=budget, **select)  # fmt: skip
        heads = list(zip(removed["layer"], removed["head"], strict=True))
        gates = head_mask(model, heads)
        if in_place is None:
            in_place = not room_for(model_bytes(model))
        if not in_place:
            pruned = prune_heads(model, heads)
    masked = Gated(model, gates)
    first = split_batch(scoring[0], budget)[0].to(next(model.parameters()).device)
    originals = parameter_table({"original": model})
    rows = []

    def scored(name: str, runner: Transformer, gates: list[torch.Tensor] | None = None) -> None:
        if gates is not None:
            runner.set_gates(gates)
        metrics = score_batches(runner, scoring, budget)
        rows.extend({"variant": name, "metric": k, "value": v} for k, v in metrics.items())
        if progress is not None:
            progress("scoring", len({r["variant"] for r in rows}), 3)

    try:
        masked_features = _features(masked, first)  # [token, d_model]
        scored("original", model, before)
        scored("masked", model, gates)
    finally:
        model.set_gates(before)
    tables = []
    share = None
    if timing:
        longest = max(scoring, key=lambda b: b.inputs.shape[1])
        sizes = timing_batches(longest, batch_sizes)
    timed = 0.0
    if in_place:  # time the original now: it is about to become the pruned model
        if timing:
            work = time.perf_counter() - started
            share = timing_budget if timing_budget is not None else (
                None if timing_share is None else timing_share * work)  # fmt: skip
            t0 = time.perf_counter()
            two = None if share is None else share * 2 / 3  # two variants of the three
            tables.append(time_forward({"original": model, "masked": masked}, sizes,
                                       repeats=repeats, threads=threads,
                                       progress=phase("timing"), budget=two))  # fmt: skip
            timed += time.perf_counter() - t0
        pruned = prune_heads(model, heads, in_place=True)
    gap = _max_logit_gap(masked_features, pruned, first)
    scored("pruned", pruned)
    work = time.perf_counter() - started - timed
    if timing_budget is None and timing_share is not None:
        timing_budget = timing_share * work
    t0 = time.perf_counter()
    if timing and in_place:
        tables.append(time_forward({"pruned": pruned}, sizes, repeats=repeats, threads=threads,
                                   progress=phase("timing"),
                                   budget=None if share is None else share / 3))  # fmt: skip
        timing_budget = share
    elif timing:
        variants = {"original": model, "masked": masked, "pruned": pruned}
        tables.append(time_forward(variants, sizes, repeats=repeats, threads=threads,
                                   progress=phase("timing"), budget=timing_budget))  # fmt: skip
    timed += time.perf_counter() - t0
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=TIMING_COLUMNS)
    return PruneComparison(
        model=pruned,
        removed=removed,
        metrics=pd.DataFrame(rows, columns=["variant", "metric", "value"]),
        parameters=pd.concat([originals, parameter_table({"pruned": pruned})], ignore_index=True),
        timing=table,
        max_logit_gap=gap,
        work_seconds=work,
        timing_budget=timing_budget if timing else None,
        timing_seconds=timed,
        in_place=bool(in_place),
    )


@torch.no_grad()
def _features(masked: Gated, batch: Batch) -> torch.Tensor:
    """The masked model's last hidden states on `batch`: [token, d_model]."""
    masked.model.set_gates(masked.gates)
    return features_batch(masked.model, batch).flatten(0, 1)


@torch.no_grad()
def _max_logit_gap(masked: torch.Tensor, pruned: Transformer, batch: Batch) -> float:
    """max |masked logits - pruned logits| over `batch` (the first scoring micro-batch), given
    the masked model's hidden states there; the vocabulary projection (which pruning leaves
    alone) LOSS_CHUNK logits at a time."""
    b = features_batch(pruned, batch).flatten(0, 1)  # [token, d_model]
    per = max(1, LOSS_CHUNK // pruned.cfg.vocab_size)
    gap = 0.0
    for start in range(0, b.shape[0], per):
        rows = slice(start, start + per)
        diff = pruned.logits(masked[rows]).float() - pruned.logits(b[rows]).float()
        gap = max(gap, float(diff.abs().max()))
    return gap
