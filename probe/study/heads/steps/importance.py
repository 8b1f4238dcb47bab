"""The importance steps: each estimator's head importance on one seed's text split; the
report's agreement section (do the estimators agree, across estimators and across seeds?) and
the [importance] section of the study file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from probe.study.heads import evidence as ev
from probe.study.heads.step import Options, Section, StepKind, StudySection
from probe.study.heads.study import HeadStudy

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject


@dataclass(frozen=True)
class ImportanceOptions:
    methods: tuple[str, ...] = ()  # head estimators compared by rank agreement


def estimators() -> tuple[str, ...]:
    """The head-importance estimators (`probe.pruning.estimators`)."""
    from probe.pruning.estimators import ESTIMATORS

    return ESTIMATORS.names()


IMPORTANCE = StudySection("importance", 10, ImportanceOptions, methods=estimators,
                          listed=lambda o: o.methods)  # fmt: skip


def importance(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    from probe.pruning.importance import head_importance

    method, seed = options["method"], options["seed"]
    split = subject.splits[0][seed]
    table = head_importance(subject.model, split, method, seed=seed, progress=progress)
    return table.assign(seed=seed)


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    return [(f"importance-{method}-s{seed}", {"method": method, "seed": seed})
            for method in study.importance.methods
            for seed in range(study.text.seeds)]  # fmt: skip


def agreement(r: Findings, rep: MarkdownReport) -> None:
    table = r.tables.get("importance")
    if table is None or table.empty:
        return
    from probe.pruning.importance import importance_correlations
    from probe.report.pruning_plots import correlation_heatmap, importance_heatmap

    rep.heading("Do the estimators agree?")
    first = table[table.seed == table.seed.min()]
    corr = importance_correlations(first)
    rep.figure(correlation_heatmap(corr), "importance_agreement.png",
               "Spearman rank correlation between estimators over all heads (seed 0; "
               "entropy negated, so positive means agreement)")  # fmt: skip
    rep.data(corr, "importance_agreement.csv", "Correlations with p-values.")
    stable = ev.seed_stability(table)
    rep.paragraph("How much each ranking depends on its text: Spearman rho between the "
                  "rankings of every pair of seeds (disjoint splits).")  # fmt: skip
    rep.table(stable, "importance_stability.csv", digits=3)
    mean = table.groupby(["layer", "head", "method"], as_index=False, sort=False).value.mean()
    rep.figure(importance_heatmap(mean), "importance_heads.png",
               "Importance of every head by each estimator (mean over seeds)")  # fmt: skip


DECLARES = StepKind("importance", 1, importance, _plan, section=IMPORTANCE,
                    reports=(Section("importance", 50, agreement),))  # fmt: skip
