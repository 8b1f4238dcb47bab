"""Analysis steps of the studies of the paper's open questions (order, many heads, cost): each
takes the trained model of a cell and returns tidy tables, like the steps in `steps.py`, whose
registry lists them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.config import choice
from probe.errors import ProbeError
from probe.study.grid.step_types import StepContext, require, resolve_lengths


@dataclass(frozen=True)
class PositionProbeOptions:
    fit_lengths: str | tuple[int, ...] = "train"  # lengths the probe is fit on ("train": L_min:L)
    lengths: str | tuple[int, ...] = "L,2L"  # lengths it is scored at (fresh data)
    batch_size: int = 32
    n_batches: int = 2  # per length
    ridge: float = 1e-3  # relative to the features' mean variance
    seed: int = 97


def _position_probe(ctx: StepContext, opts: PositionProbeOptions) -> dict[str, pd.DataFrame]:
    """`probe.analysis.positions_probe`: how well a linear probe reads each token's absolute
    position off the residual stream at each depth (0: the embeddings, d: after block d), at the
    training lengths and beyond; for an encoder also how far it is from permutation-equivariant
    (statistic permutation_gap: max |f(x[pi]) - f(x)[pi]| over the final hidden states)."""
    probing = require("position_probe", "probe.analysis.positions_probe")
    from probe.measure.evaluate import eval_batches, form_for

    low, high = ctx.train.train_len
    fit = (
        list(range(low, high + 1))
        if opts.fit_lengths == "train"
        else resolve_lengths(opts.fit_lengths, ctx.train_max)
    )
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    table = probing.position_probe(
        ctx.model, ctx.task, fit, lengths, batch_size=opts.batch_size,
        n_batches=opts.n_batches, seed=opts.seed, ridge=opts.ridge, progress=ctx.progress,
    )  # fmt: skip
    # "layer" elsewhere counts attention sub-layers; here it is the depth of the residual stream
    table = table.rename(columns={"layer": "depth", "metric": "statistic"})
    if str(ctx.model.cfg.arch) == "encoder":
        form = form_for(ctx.model.cfg.arch)
        gaps = []
        for n in lengths:
            batch = next(iter(eval_batches(ctx.task, form, [n], opts.batch_size, 1, opts.seed)))
            gap = probing.permutation_gap(ctx.model, batch.to(ctx.device), seed=opts.seed)
            gaps.append({"depth": int(table["depth"].max()), "length": n, "seen": n <= high,
                         "statistic": "permutation_gap", "value": gap,
                         "n_tokens": int(batch.inputs.numel())})  # fmt: skip
        table = pd.concat([table, pd.DataFrame(gaps)], ignore_index=True)
    return {"position_probe": table}


def _check_position_probe(opts: PositionProbeOptions) -> None:
    if opts.fit_lengths != "train":
        resolve_lengths(opts.fit_lengths, 16)
    if not opts.ridge >= 0:
        raise ProbeError(f"[analysis.position_probe] ridge must be >= 0, got {opts.ridge!r}.")


@dataclass(frozen=True)
class RolesOptions:
    lengths: str | tuple[int, ...] = "L"  # task lengths whose data give the attention profiles
    batch_size: int = 32
    n_batches: int = 1
    period: int = 8  # induction: length of the random sequence that is repeated
    seed: int = 531


def _roles(ctx: StepContext, opts: RolesOptions) -> dict[str, pd.DataFrame]:
    """`probe.analysis.roles.head_roles`: every head's previous-token, induction, positional and
    sink score (mean attention probabilities in [0, 1]) on the task's data."""
    roles = require("roles", "probe.analysis.roles")
    from probe.measure.evaluate import eval_batches, form_for

    form = form_for(ctx.model.cfg.arch)
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    batches = list(
        eval_batches(ctx.task, form, lengths, opts.batch_size, opts.n_batches, opts.seed)
    )
    table = roles.head_roles(ctx.model, batches, period=opts.period, seed=opts.seed)
    return {"roles": table}


@dataclass(frozen=True)
class AttentionCostOptions:
    ns: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)  # sequence lengths
    methods: tuple[str, ...] = ("explicit", "sdpa", "streaming_entropy")
    repeats: int = 3
    batch: int = 1
    causal: bool = True
    tile: int = 128  # keys per tile of the streaming statistics (fixed: memory n x tile)
    threads: int = 1  # torch CPU threads while measuring
    seed: int = 0


def _attention_cost(ctx: StepContext, opts: AttentionCostOptions) -> dict[str, pd.DataFrame]:
    """`probe.analysis.attention_cost`: seconds and measured peak memory of one attention core
    (one layer's heads) at each sequence length, for each implementation, on random q, k, v of
    the cell's shape (its n_head and d_head; the trained weights play no part)."""
    cost = require("attention_cost", "probe.analysis.attention_cost")
    cfg = ctx.model.cfg
    table = cost.attention_cost(
        opts.ns, d_head=cfg.d_head, n_head=cfg.n_head, batch=opts.batch, causal=opts.causal,
        methods=opts.methods, repeats=opts.repeats, tile=opts.tile, seed=opts.seed,
        device=ctx.device, threads=opts.threads, progress=ctx.progress,
    )  # fmt: skip
    return {"attention_cost": table.rename(columns={"n": "seq_len"})}


def _check_attention_cost(opts: AttentionCostOptions) -> None:
    from probe.analysis.attention_cost import Method

    for method in opts.methods:
        choice(Method, method, "attention cost method")
    if not opts.ns or any(not isinstance(n, int) or n < 2 for n in opts.ns):
        raise ProbeError(f"[analysis.attention_cost] ns must be whole numbers >= 2, got {opts.ns}.")


@dataclass(frozen=True)
class ImportanceOptions:
    methods: tuple[str, ...] = (
        "gradient", "fisher", "ablation", "mean-ablation", "confidence", "entropy",
    )  # fmt: skip
    lengths: str | tuple[int, ...] = "L"
    batch_size: int = 64
    n_batches: int = 2
    seed: int = 2469  # the prune step's first importance split (seed + 1 there): the same data


def _importance(ctx: StepContext, opts: ImportanceOptions) -> dict[str, pd.DataFrame]:
    """`probe.pruning.importance.head_importance` of every head by each estimator, on one set
    of task data (by default the prune step's first importance split)."""
    importance = require("importance", "probe.pruning.importance")
    from probe.measure.evaluate import eval_batches, form_for

    form = form_for(ctx.model.cfg.arch)
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    batches = list(
        eval_batches(ctx.task, form, lengths, opts.batch_size, opts.n_batches, opts.seed)
    )
    tables = [importance.head_importance(ctx.model, batches, m) for m in opts.methods]
    return {"importance": pd.concat(tables, ignore_index=True)}


def _check_importance(opts: ImportanceOptions) -> None:
    from probe.pruning.importance import Method

    for method in opts.methods:
        choice(Method, method, "importance method")


@dataclass(frozen=True)
class PruneTimingOptions:
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # of all heads, physically removed
    method: str = "gradient"  # the estimator choosing the heads
    lengths: str | tuple[int, ...] = "L"  # importance data and the timed batch's length
    batch_sizes: tuple[int, ...] = (1, 64)
    repeats: int = 20
    threads: int = 1
    batch_size: int = 64
    n_batches: int = 2
    seed: int = 2469


def _prune_timing(ctx: StepContext, opts: PruneTimingOptions) -> dict[str, pd.DataFrame]:
    """Seconds per forward pass of the physically pruned model (`prune_model`: the heads go from
    the weights) against the original, side by side in one process on `threads` threads, at
    each fraction; columns fraction, n_pruned, batch_size, part, seconds, ratio, params."""
    pruning = require("prune_timing", "probe.pruning.heads")
    from probe.measure.evaluate import eval_batches, form_for
    from probe.pruning.timing import time_forward, time_ratios, timing_batches

    form = form_for(ctx.model.cfg.arch)
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    data = list(eval_batches(ctx.task, form, lengths, opts.batch_size, opts.n_batches, opts.seed))
    longest = max(data, key=lambda b: b.inputs.shape[1]).to(ctx.device)
    batches = timing_batches(longest, opts.batch_sizes)
    original_params = ctx.model.parameter_counts()["total"]
    rows = []
    for i, fraction in enumerate(opts.fractions):
        result = pruning.prune_model(ctx.model, data, fraction, method=opts.method)
        timing = time_forward({"original": ctx.model, "pruned": result.model}, batches,
                              warmup=2, repeats=opts.repeats, threads=opts.threads)  # fmt: skip
        ratios = time_ratios(timing)
        pruned = timing.merge(ratios, on=["variant", "batch_size", "part"])
        pruned = pruned[pruned["variant"] == "pruned"].drop(columns="variant")
        rows.append(pruned.assign(
            fraction=fraction, n_pruned=len(result.removed), method=opts.method,
            params=result.model.parameter_counts()["total"], original_params=original_params,
        ))  # fmt: skip
        if ctx.progress is not None:
            ctx.progress(i + 1, len(opts.fractions))
    return {"prune_timing": pd.concat(rows, ignore_index=True)}
