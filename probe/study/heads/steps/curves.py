"""The curve steps: one pruning curve per method, unit (query head or key/value group) and seed,
scored on the one scoring split; the report's sections on how many heads can go (curves and
operating points) and on what mask tuning recovers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from probe.pruning.curves import pruning_curve
from probe.report.pruning_plots import pruning_curve_plot
from probe.report.report import MarkdownReport
from probe.study.heads import evidence as ev
from probe.study.heads.findings import Findings
from probe.study.heads.step import Options, Section, StepKind
from probe.study.heads.study import HeadStudy
from probe.study.heads.subject import Subject

# which mask tuning the fisher+tune curves use: in their options, so a change of definition
# recomputes exactly the steps that use it
MASK_TUNING = "kwon2022-layer-by-layer"


def curve(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    o = options
    sets, scoring = subject.splits
    table = pruning_curve(subject.model, [sets[o["seed"]]], scoring, [o["method"]],
                          list(o["fractions"]), unit=o["unit"], seeds=[o["seed"]],
                          progress=progress)  # fmt: skip
    return table.assign(unit=o["unit"])


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    steps = []
    by_unit = [("head", m) for m in study.curves.methods]
    by_unit += [("group", m) for m in study.curves.group_methods]
    for unit, method in by_unit:
        for seed in range(study.text.seeds):
            options = {"method": method, "unit": unit, "seed": seed,
                       "fractions": list(study.curves.fractions)}  # fmt: skip
            if method == "fisher+tune":
                options["tune"] = MASK_TUNING
            steps.append((f"curve-{unit}-{method}-s{seed}", options))
    return steps


def pruning(r: Findings, rep: MarkdownReport) -> None:
    if r.curves.empty:
        return
    rep.heading("How many heads can go")
    for unit, title in (("head", "by query head"), ("group", "by key/value group")):
        part = r.curves[r.curves.unit == unit]
        if part.empty:
            continue
        fig = pruning_curve_plot(part, r.metric, f"{r.study['name']}: {title}",
                                 threshold=r.threshold())  # fmt: skip
        rep.figure(fig, f"pruning_{unit}_{r.metric}.png",
                   f"{r.metric} on the scoring split against the share of heads removed "
                   f"{title}")  # fmt: skip
    if r.metric == "similarity" and "neighbours" in set(r.curves.metric):
        fig = pruning_curve_plot(r.curves, "neighbours", f"{r.study['name']}")
        rep.figure(fig, "pruning_neighbours.png", "share of rows whose nearest other row (by "
                   "cosine) is the same as under the unpruned model")  # fmt: skip
    rep.data(r.curves, "curves.csv", "Every curve point, per method, unit and seed.")
    ops = r.ops
    if r.metric == "loss":  # perplexity beside the loss it is the exponential of
        ops = ops.assign(**{"perplexity there": np.exp(ops.value),
                            "unpruned perplexity": np.exp(ops.reference)})  # fmt: skip
    ops = ops.rename(columns={"value": f"{r.metric} there",
                              "reference": f"unpruned {r.metric}"})  # fmt: skip
    rep.paragraph(
        f"Operating point: the largest share of heads removed such that "
        f"{r.criterion()} at it and at every smaller share, per seed."
    )
    rep.table(ops, "operating_points.csv", digits=3)
    looser = []
    for factor in (5, 10):
        tol = r.tolerance * factor
        summary = ev.operating_summary(r.curves, r.objective, tol, r.n_heads)
        looser.append(summary.assign(tolerance=tol))
    looser = pd.concat(looser)[["tolerance", "method", "unit", "min_fraction", "max_fraction",
                                "per_seed"]]  # fmt: skip
    rep.paragraph(f"The same at looser tolerances ({r.metric} moved by up to 5 and 10 "
                  "times the study's), for a fuller picture; the verdicts below use the "
                  "study's own.")  # fmt: skip
    rep.table(looser, "operating_points_looser.csv", digits=3)
    versus = ev.against_random(r.curves, r.objective)
    if not versus.empty:
        rep.paragraph(
            f"Against random rankings: mean {r.metric} over the curve up to half the heads, "
            "one value per seed; p: exact one-sided Mann-Whitney U test that the method's "
            "seeds beat the random seeds."
        )
        rep.table(versus, "against_random.csv", digits=4)


def tuning(r: Findings, rep: MarkdownReport) -> None:
    rec = ev.tuning_recovery(r.curves) if not r.curves.empty else pd.DataFrame()
    if rec.empty:
        return
    rep.heading("What mask tuning recovers", 3)
    rep.paragraph("The same Fisher ranking pruned with and without mask tuning (Kwon et al. "
                  "2022's procedure: layer by layer, the kept heads rescaled by least squares "
                  "on the pruned model's own inputs to reproduce the unpruned layer's "
                  "output): loss "
                  "increase over the unpruned model, and the share of it tuning recovers, "
                  "per seed.")  # fmt: skip
    rep.table(rec, "tuning_recovery.csv", digits=3)


KINDS = (StepKind("curves", 3, curve, _plan),)
SECTIONS = (Section("pruning", 20, pruning), Section("tuning", 30, tuning))
