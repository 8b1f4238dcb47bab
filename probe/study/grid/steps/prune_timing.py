"""prune_timing: forward-pass time of the physically pruned model against the original
(`prune_timing`), and its report section."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.measure.evaluate import eval_batches, form_for
from probe.pruning.heads import prune_model
from probe.pruning.timing import time_forward, time_ratios, timing_batches
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.verdicts.summary import arm_sorted


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


def run(ctx: StepContext, opts: PruneTimingOptions) -> dict[str, pd.DataFrame]:
    """Seconds per forward pass of the physically pruned model (`prune_model`: the heads go from
    the weights) against the original, side by side in one process on `threads` threads, at
    each fraction; columns fraction, n_pruned, batch_size, part, seconds, ratio, params."""
    form = form_for(ctx.model.cfg.arch)
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    data = list(eval_batches(ctx.task, form, lengths, opts.batch_size, opts.n_batches, opts.seed))
    longest = max(data, key=lambda b: b.inputs.shape[1]).to(ctx.device)
    batches = timing_batches(longest, opts.batch_sizes)
    original_params = ctx.model.parameter_counts()["total"]
    rows = []
    for i, fraction in enumerate(opts.fractions):
        result = prune_model(ctx.model, data, fraction, method=opts.method)
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


def section(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    rows = table[table["part"] == "model"]
    rep.heading("Speed of the physically pruned models")
    rep.paragraph(
        "Forward-pass time of the model with the heads removed from its weights, over the "
        "original's, timed side by side in one process on one thread (median of the repeats; "
        "below 1 is faster). The heads are the least important by "
        f"{rows['method'].iloc[0]} importance. Per arm, fraction and batch size the median "
        "over seeds is shown with the smallest and largest seed's ratio (a timing disturbed by "
        "other work on the machine shows as one outlying seed)."
    )
    keys = ["arm", "fraction", "batch_size"]
    agg = rows.groupby(keys, sort=False)["ratio"].agg(["median", "min", "max"]).reset_index()
    shown = agg.assign(
        ratio=agg.apply(lambda r: f"{r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]", axis=1),
        speedup=(1 / agg["median"]).map("{:.2f}x".format),
        fraction=agg["fraction"].map(lambda f: f"{100 * f:g}%"),
    )[[*keys, "ratio", "speedup"]]
    rep.table(arm_sorted(shown, order), "prune_timing.csv", data=table,
              caption="Time ratio pruned / original: median over seeds [smallest, largest]; "
              "speed-up = 1 / median ratio.")  # fmt: skip
    pooled = rows.groupby(["fraction", "batch_size"], as_index=False)["ratio"].median()
    text = "; ".join(f"{100 * r.fraction:g}% of heads at batch {r.batch_size}: "
                     f"{1 / r.ratio:.2f}x" for r in pooled.itertuples())  # fmt: skip
    finding = f"Speed-up of the physically pruned models (median over arms and seeds): {text}."
    rep.bullets([finding])
    return [finding]


STEP = Step(
    "prune_timing", PruneTimingOptions, run, ("prune_timing",),
    "forward-pass time of the physically pruned model against the original",
    sections=(Section("prune_timing", 110, ("prune_timing",),
                      lambda rep, given: section(rep, given.tables["prune_timing"], given.order)),),
)  # fmt: skip
