"""prune: the metrics after masking the least important heads, per estimator and fraction
(`pruning`), and the report section that presents the pruning curves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from probe.errors import ProbeError
from probe.measure.evaluate import form_for
from probe.pruning.curves import pruning_curve
from probe.pruning.estimators import ESTIMATORS
from probe.pruning.heads import present_heads
from probe.pruning.importance import disjoint_splits
from probe.pruning.objectives import primary
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.grid.steps.shared import seed_note
from probe.study.verdicts import summary
from probe.study.verdicts.stats import row_ci


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


def run(ctx: StepContext, opts: PruneOptions) -> dict[str, pd.DataFrame]:
    """`probe.pruning.curves.pruning_curve`: the metrics after masking the least important
    heads, per estimator and fraction (0: the unpruned model), importance measured on data
    disjoint from the scoring data."""
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    splits, scoring = disjoint_splits(
        ctx.task, form_for(ctx.model.cfg.arch), lengths, batch_size=opts.batch_size,
        n_batches=opts.n_batches, seed=opts.seed, n_importance=opts.splits,
    )  # fmt: skip
    table = pruning_curve(
        ctx.model, splits, scoring, list(opts.methods), [0.0, *opts.fractions],
        progress=ctx.progress,
    )  # fmt: skip
    if opts.iterative:
        again = pruning_curve(
            ctx.model, splits, scoring, list(opts.iterative), [0.0, *opts.fractions],
            iterative=True, progress=ctx.progress,
        )  # fmt: skip
        again = again[again["fraction"] > 0].assign(method=again["method"] + " iterative")
        table = pd.concat([table, again], ignore_index=True)
    n_heads = sum(len(h) for h in present_heads(ctx.model))
    table = table.rename(columns={"seed": "split"}).assign(n_heads=n_heads)
    return {"pruning": table}


def check(opts: PruneOptions) -> None:
    for method in (*opts.methods, *opts.iterative):
        ESTIMATORS.get(method)
    for fraction in opts.fractions:
        if not 0.0 < float(fraction) <= 1.0:
            raise ProbeError(f"fractions must lie in (0, 1], got {fraction}.")


def section(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    rows = summary.pruning_rows(table, primary(None).metric)  # a task model's: exact match
    rep.heading("Pruning heads")
    rep.paragraph(
        "Exact match after masking the least important heads (gates at 0), ranked by each "
        "estimator on data disjoint from the scoring data; 'random' is the baseline of Prasanna "
        "et al. 2020. Fraction 0 is the unpruned model; fractions are of all heads, rounded to "
        "whole heads."
    )
    rep.figure(plots.pruning_curves(rows, "exact match"), "pruning.png",
               "Exact match against the fraction of heads removed")  # fmt: skip
    stats = summary.over_seeds(rows, ["arm", "method", "fraction"])
    shown = stats.assign(text=stats.apply(row_ci, axis=1),
                         fraction=stats["fraction"].map(lambda f: f"{100 * f:g}%"))  # fmt: skip
    wide = shown.pivot_table(index=["arm", "method"], columns="fraction", values="text",
                             aggfunc="first", sort=False)  # fmt: skip
    columns = [f"{100 * f:g}%" for f in sorted(stats["fraction"].unique())]
    wide = wide[[c for c in columns if c in wide.columns]].reset_index()
    wide = summary.arm_sorted(wide, order)
    rep.table(wide, "pruning.csv", data=rows, caption=seed_note(stats))
    findings = []
    for arm, part in stats.groupby("arm", sort=False):
        base = float(part.loc[part["fraction"] == 0, "mean"].mean())
        pruned = part[part["fraction"] > 0]
        if base < 0.5 or pruned.empty:
            findings.append(f"{arm}: the unpruned model scores {base:.2f}, so its pruning curve "
                            "says little.")  # fmt: skip
            continue
        first = pruned[pruned["fraction"] == pruned["fraction"].min()]
        after = ", ".join(f"{r.mean:.2f} ranked by {r.method}" for r in first.itertuples())
        kept = []
        for method, curve in pruned.groupby("method"):
            ok = curve[curve["mean"] >= base - 0.01]["fraction"]
            kept.append(f"{100 * (ok.max() if len(ok) else 0):g}% by {method}")
        findings.append(
            f"{arm}: removing {100 * first['fraction'].iloc[0]:g}% of the heads takes exact "
            f"match from {base:.2f} to {after}; removable for at most 1 point: {', '.join(kept)}."
        )
    rep.bullets(findings)
    return findings


STEP = Step(
    "prune", PruneOptions, run, ("pruning",),
    "accuracy after removing a growing fraction of heads, by importance and at random", check,
    sections=(Section("pruning", 80, ("pruning",),
                      lambda rep, given: section(rep, given.tables["pruning"], given.order)),),
)  # fmt: skip
