"""The analyses a study runs on each trained model: a registry of named steps.

A step takes the trained model and the cell's configs (a `StepContext`) plus its own validated
options and returns tidy DataFrames by table name. Steps that need another part of probe import it
lazily, so a study that does not use them runs without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from probe.config import choice, did_you_mean, from_dict
from probe.errors import ProbeError
from probe.study.grid import steps_questions as q
from probe.study.grid.step_types import Step, StepContext, require, resolve_lengths

# ------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class EvalLengthsOptions:
    lengths: str | tuple[int, ...] = "1:2L"  # task lengths to evaluate at (L: longest trained)
    batch_size: int = 64  # examples per batch
    n_batches: int = 2  # batches per length
    seed: int = 1234  # evaluation data seed (the same data for every cell)


@dataclass(frozen=True)
class AttentionOptions:
    lengths: str | tuple[int, ...] = "L,2L"  # lengths at which to record attention statistics
    statistics: tuple[str, ...] = (
        "entropy",
        "normalized_entropy",
        "p_max",
        "max_logit",
        "sink_mass",
        "attention_distance",
    )  # see probe.measure.streaming
    batch_size: int = 32
    n_batches: int = 1
    seed: int = 4321


@dataclass(frozen=True)
class PruneOptions:
    fractions: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)  # of all heads (rounded to whole heads)
    methods: tuple[str, ...] = ("gradient", "random")  # importance estimators ranking the heads
    lengths: str | tuple[int, ...] = "L"  # lengths of the importance and scoring data
    splits: int = 1  # importance data splits (each also reseeds the random ranking)
    batch_size: int = 64
    n_batches: int = 2
    seed: int = 2468  # scoring data; importance split r comes from seed + 1 + r, disjoint
    iterative: tuple[str, ...] = ()  # methods also run iteratively (labelled "METHOD iterative")

    # added after cells were cached: left out of a cell's key at their default, so the cells
    # computed before them stay valid
    added_later: ClassVar[tuple[str, ...]] = ("iterative",)


@dataclass(frozen=True)
class InitScalingOptions:
    d_ks: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)  # key widths, independent of the cell
    ns: tuple[int, ...] = (128, 1024)  # keys per query
    n_queries: int = 512
    seed: int = 0


# -------------------------------------------------------------------------------------- steps


def _eval_lengths(ctx: StepContext, opts: EvalLengthsOptions) -> dict[str, pd.DataFrame]:
    from probe.measure.evaluate import evaluate

    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    table = evaluate(
        ctx.model, ctx.task, lengths, batch_size=opts.batch_size, n_batches=opts.n_batches,
        seed=opts.seed, device=ctx.device, progress=ctx.progress,
    )  # fmt: skip
    return {"eval": table}


def _attention(ctx: StepContext, opts: AttentionOptions) -> dict[str, pd.DataFrame]:
    observe = require("attention", "probe.measure.observe")
    from probe.measure.evaluate import eval_batches, form_for

    form = form_for(ctx.model.cfg.arch)
    batches = [
        batch
        for n in resolve_lengths(opts.lengths, ctx.train_max)
        for batch in eval_batches(
            ctx.task, form, [n], opts.batch_size, opts.n_batches, opts.seed + n
        )
    ]
    table = observe.attention_stats(
        ctx.model, batches, list(opts.statistics), progress=ctx.progress
    )
    return {"attention": table}


def _init_scaling(ctx: StepContext, opts: InitScalingOptions) -> dict[str, pd.DataFrame]:
    """The sqrt(d_k) argument at initialization (`probe.analysis.scaling.init_scaling`): scores
    of unit-variance q and k under each fixed scale, against d_k. It does not depend on the cell,
    so every cell gives the same table (computing it takes well under a second)."""
    scaling = require("init_scaling", "probe.analysis.scaling")
    table = scaling.init_scaling(opts.d_ks, opts.ns, n_queries=opts.n_queries, seed=opts.seed)
    # "scale" would collide with a grid factor model.scale among the cell's identity columns
    return {"init_scaling": table.rename(columns={"scale": "score_scale"})}


def _prune(ctx: StepContext, opts: PruneOptions) -> dict[str, pd.DataFrame]:
    """`probe.pruning.curves.pruning_curve`: the metrics after masking the least important
    heads, per estimator and fraction (0: the unpruned model), importance measured on data
    disjoint from the scoring data."""
    runs = require("prune", "probe.pruning.curves")
    from probe.measure.evaluate import form_for
    from probe.pruning.heads import present_heads
    from probe.pruning.importance import disjoint_splits

    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    splits, scoring = disjoint_splits(
        ctx.task, form_for(ctx.model.cfg.arch), lengths, batch_size=opts.batch_size,
        n_batches=opts.n_batches, seed=opts.seed, n_importance=opts.splits,
    )  # fmt: skip
    table = runs.pruning_curve(
        ctx.model, splits, scoring, list(opts.methods), [0.0, *opts.fractions],
        progress=ctx.progress,
    )  # fmt: skip
    if opts.iterative:
        again = runs.pruning_curve(
            ctx.model, splits, scoring, list(opts.iterative), [0.0, *opts.fractions],
            iterative=True, progress=ctx.progress,
        )  # fmt: skip
        again = again[again["fraction"] > 0].assign(method=again["method"] + " iterative")
        table = pd.concat([table, again], ignore_index=True)
    n_heads = sum(len(h) for h in present_heads(ctx.model))
    table = table.rename(columns={"seed": "split"}).assign(n_heads=n_heads)
    return {"pruning": table}


def _check_attention(opts: AttentionOptions) -> None:
    observe = require("attention", "probe.measure.observe")
    observe.check_statistics(list(opts.statistics))


def _check_prune(opts: PruneOptions) -> None:
    from probe.pruning.importance import Method

    for method in (*opts.methods, *opts.iterative):
        choice(Method, method, "importance method")
    for fraction in opts.fractions:
        if not 0.0 < float(fraction) <= 1.0:
            raise ProbeError(f"fractions must lie in (0, 1], got {fraction}.")


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step("eval_lengths", EvalLengthsOptions, _eval_lengths, ("eval",),
             "exact match, token accuracy and loss at each task length"),
        Step("attention", AttentionOptions, _attention, ("attention",),
             "per-head attention statistics (entropy, max logit, ...) at each length",
             _check_attention),
        Step("init_scaling", InitScalingOptions, _init_scaling, ("init_scaling",),
             "score variance, entropy, one-hot rows and softmax gradient at initialization "
             "against d_k, per fixed scale"),
        Step("prune", PruneOptions, _prune, ("pruning",),
             "accuracy after removing a growing fraction of heads, by importance and at random",
             _check_prune),
        Step("position_probe", q.PositionProbeOptions, q._position_probe, ("position_probe",),
             "how well a linear probe reads absolute position off each depth of the residual "
             "stream (and, for encoders, the gap to permutation equivariance)",
             q._check_position_probe),
        Step("roles", q.RolesOptions, q._roles, ("roles",),
             "each head's previous-token, induction, positional and sink score"),
        Step("attention_cost", q.AttentionCostOptions, q._attention_cost, ("attention_cost",),
             "seconds and measured peak memory of one attention layer against sequence length: "
             "explicit softmax(QK^T)V, fused SDPA and streaming statistics",
             q._check_attention_cost),
        Step("importance", q.ImportanceOptions, q._importance, ("importance",),
             "every head's importance by each estimator (for their agreement)",
             q._check_importance),
        Step("prune_timing", q.PruneTimingOptions, q._prune_timing, ("prune_timing",),
             "forward-pass time of the physically pruned model against the original"),
    )
}  # fmt: skip


def get_step(name: str) -> Step:
    if name not in STEPS:
        raise ProbeError(
            f"Unknown analysis '{name}'.{did_you_mean(name, list(STEPS))} "
            f"Available: {', '.join(STEPS)}."
        )
    return STEPS[name]


def parse_options(name: str, raw: dict[str, Any]) -> Any:
    """Validated options of step `name` from a study file's [analysis.NAME] table."""
    step = get_step(name)
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(raw).items()}
    options = from_dict(step.options, data, f"analysis.{name}")
    if hasattr(options, "lengths"):
        resolve_lengths(options.lengths, 16)  # fail now on a malformed spec, not mid-study
    if step.check is not None:
        step.check(options)
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.name in ("batch_size", "n_batches", "splits") and (
            not isinstance(value, int) or value < 1
        ):
            raise ProbeError(
                f"[analysis.{name}] {f.name} must be a whole number >= 1, got {value!r}."
            )
    return options


def options_dict(options: Any) -> dict[str, Any]:
    """JSON-ready options (for hashing and the manifest)."""
    later = getattr(options, "added_later", ())
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(options).items()
        if not (k in later and v == defaults[k])
    }
