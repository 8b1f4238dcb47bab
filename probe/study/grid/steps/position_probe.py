"""position_probe: how well a linear probe reads each token's absolute position off each depth
of the residual stream (`position_probe`), and its report section."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.analysis.positions_probe import permutation_gap, position_probe
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches, form_for
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.verdicts.stats import interval_words, over_seeds, row_ci
from probe.study.verdicts.summary import arm_sorted


@dataclass(frozen=True)
class PositionProbeOptions:
    fit_lengths: str | tuple[int, ...] = "train"  # lengths the probe is fit on ("train": L_min:L)
    lengths: str | tuple[int, ...] = "L,2L"  # lengths it is scored at (fresh data)
    batch_size: int = 32
    n_batches: int = 2  # per length
    ridge: float = 1e-3  # relative to the features' mean variance
    seed: int = 97


def run(ctx: StepContext, opts: PositionProbeOptions) -> dict[str, pd.DataFrame]:
    """`probe.analysis.positions_probe`: how well a linear probe reads each token's absolute
    position off the residual stream at each depth (0: the embeddings, d: after block d), at the
    training lengths and beyond; for an encoder also how far it is from permutation-equivariant
    (statistic permutation_gap: max |f(x[pi]) - f(x)[pi]| over the final hidden states)."""
    low, high = ctx.train.train_len
    fit = (
        list(range(low, high + 1))
        if opts.fit_lengths == "train"
        else resolve_lengths(opts.fit_lengths, ctx.train_max)
    )
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    table = position_probe(
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
            gap = permutation_gap(ctx.model, batch.to(ctx.device), seed=opts.seed)
            gaps.append({"depth": int(table["depth"].max()), "length": n, "seen": n <= high,
                         "statistic": "permutation_gap", "value": gap,
                         "n_tokens": int(batch.inputs.numel())})  # fmt: skip
        table = pd.concat([table, pd.DataFrame(gaps)], ignore_index=True)
    return {"position_probe": table}


def check(opts: PositionProbeOptions) -> None:
    if opts.fit_lengths != "train":
        resolve_lengths(opts.fit_lengths, 16)
    if not opts.ridge >= 0:
        raise ProbeError(f"[analysis.position_probe] ridge must be >= 0, got {opts.ridge!r}.")


def section(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    r2 = table[table["statistic"] == "r2"]
    if r2.empty:
        return []
    rep.heading("Where is each token? A linear probe for absolute position")
    rep.paragraph(
        "At every depth of the residual stream (0: the embeddings, d: the output of block d) a "
        "ridge regression is fit from each task symbol's hidden state to its absolute position, "
        "on data at the training lengths, and scored by R^2 on fresh data at each length (R^2 "
        "below 0 means worse than predicting the mean position). Special tokens are left out: "
        "their identity alone gives their position away."
    )
    rep.figure(plots.depth_curves(r2, "R^2 of the position probe", order=order),
               "position_probe.png", "Position probe R^2 against depth, per length")  # fmt: skip
    stats = over_seeds(r2, ["arm", "length", "depth"])
    wide = (
        stats.assign(text=stats.apply(row_ci, axis=1), depth=stats["depth"].map("depth {}".format))
        .pivot_table(index=["arm", "length"], columns="depth", values="text", aggfunc="first")
        .reset_index()
    )
    rep.table(arm_sorted(wide, order), "position_probe.csv", data=table,
              caption=f"R^2 per depth: {interval_words(stats['n_seeds'])}.")  # fmt: skip
    findings = []
    deepest = int(r2["depth"].max())
    for n, part in stats[stats["depth"] >= 1].groupby("length"):
        best = part.loc[part.groupby("arm")["mean"].idxmax()]
        best = arm_sorted(best, order)
        text = ", ".join(f"{r.arm} {r.mean:.2f} (depth {r.depth})" for r in best.itertuples())
        findings.append(
            f"Best position-probe R^2 at length {n} over depths 1 to {deepest}: {text}."
        )
    gaps = table[table["statistic"] == "permutation_gap"]
    if not gaps.empty:
        g = over_seeds(gaps, ["arm", "length"])
        g = g.assign(gap=g["mean"].map(lambda v: f"{v:.2g}"))[["arm", "length", "gap", "values"]]
        rep.table(arm_sorted(g, order), "permutation_gap.csv", data=gaps,
                  caption="Encoders: max |f(x[pi]) - f(x)[pi]| over the final hidden states for "
                  "a random permutation pi of the prompt (0 up to rounding: the encoder cannot "
                  "tell orders apart). Mean over seeds; per-seed values listed.")  # fmt: skip
        text = ", ".join(f"{r.arm} {r.gap}" for r in g.drop_duplicates("arm").itertuples())
        findings.append(f"Encoders' gap to permutation equivariance: {text}.")
    rep.bullets(findings)
    return findings


STEP = Step(
    "position_probe", PositionProbeOptions, run, ("position_probe",),
    "how well a linear probe reads absolute position off each depth of the residual stream "
    "(and, for encoders, the gap to permutation equivariance)", check,
    sections=(Section("position_probe", 70, ("position_probe",),
                      lambda rep, given: section(rep, given.tables["position_probe"],
                                                 given.order)),),
)  # fmt: skip
