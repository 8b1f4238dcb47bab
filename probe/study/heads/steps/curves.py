"""The curve steps: one pruning curve per method, unit (query head or key/value group) and seed,
scored on the one scoring split; the report's sections on how many heads can go (curves and
operating points) and on what mask tuning recovers, the answer's pruning sentence, the claims of
Michel et al. 2019, Kwon et al. 2022 and He et al. 2024, and the [curves] section of the study
file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from probe.errors import ProbeError
from probe.study.heads import claims
from probe.study.heads import evidence as ev
from probe.study.heads.answer import pruning_answer
from probe.study.heads.step import Claim, Options, Section, StepKind, StudySection
from probe.study.heads.steps.importance import estimators
from probe.study.heads.study import HeadStudy

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject

# which mask tuning the fisher+tune curves use: in their options, so a change of definition
# recomputes exactly the steps that use it
MASK_TUNING = "kwon2022-layer-by-layer"


@dataclass(frozen=True)
class CurveOptions:
    methods: tuple[str, ...] = ()  # by query head: estimators, "fisher+tune", "attention-layer"
    group_methods: tuple[str, ...] = ()  # by whole key/value group: estimators
    fractions: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _curve_methods() -> tuple[str, ...]:
    """The estimators, and the curves' own methods (`probe.pruning.choices.CURVE_EXTRAS`)."""
    from probe.pruning.choices import CURVE_EXTRAS

    return (*estimators(), *CURVE_EXTRAS)


def increasing(study: HeadStudy, section: str, values: tuple[float, ...]) -> None:
    """A section's fractions increase, without repeats (else one line naming it)."""
    if list(values) != sorted(set(values)):
        raise ProbeError(f"{study.where} [{section}] fractions must increase, without repeats: "
                         f"got {list(values)}.")  # fmt: skip


def _check(study: HeadStudy) -> None:
    """Group curves by estimators only; fractions that increase within [0, 1], from 0.0 (the
    unpruned model) to at least one larger share where a curve is asked for."""
    from probe.pruning.choices import CURVE_EXTRAS

    where, c = study.where, study.curves
    extras = sorted(set(c.group_methods) & set(CURVE_EXTRAS))
    if extras:
        raise ProbeError(
            f"{where} [curves] group_methods: {', '.join(extras)} prune by head or by layer, not "
            "by key/value group; list them under methods."
        )
    increasing(study, "curves", c.fractions)
    for f in c.fractions:
        if not 0.0 <= f <= 1.0:
            raise ProbeError(
                f"{where} [curves] fractions must lie in [0, 1] (shares of the heads removed), "
                f"got {f}."
            )
    if (c.methods or c.group_methods) and (not c.fractions or c.fractions[0] != 0.0
                                           or len(c.fractions) < 2):  # fmt: skip
        raise ProbeError(
            f"{where} [curves] fractions must start at 0.0 (the unpruned model every point is "
            f"compared with) and go on to at least one larger share, got {list(c.fractions)}."
        )


def _listed(o: CurveOptions) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*o.methods, *o.group_methods)))


CURVES = StudySection("curves", 20, CurveOptions, check=_check, methods=_curve_methods,
                      method_fields=("methods", "group_methods"), listed=_listed)  # fmt: skip


def curve(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    from probe.pruning.curves import pruning_curve

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
    from probe.report.pruning_plots import pruning_curve_plot

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


DECLARES = StepKind(
    "curves", 3, curve, _plan, section=CURVES,
    reports=(Section("pruning", 20, pruning), Section("tuning", 30, tuning)),
    answer=pruning_answer,
    claims=(Claim("michel2019", 10, claims.michel, ("michel2019",)),
            Claim("kwon2022", 20, claims.kwon, ("kwon2022",)),
            Claim("he2024", 30, claims.he, ("he2024",))),
)  # fmt: skip
