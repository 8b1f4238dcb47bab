"""importance: every head's importance by each estimator (`importance`), and the report sections
on how the estimators agree and which roles the heads that survive pruning have."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from scipy import stats

from probe.analysis.roles import DOMINANT
from probe.measure.evaluate import eval_batches, form_for
from probe.pruning.estimators import ESTIMATORS
from probe.pruning.importance import head_importance, importance_correlations
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.verdicts.stats import interval_words, over_seeds, row_ci
from probe.study.verdicts.summary import arm_sorted

KEEP = 0.5  # the survivors: the most important half of the heads


@dataclass(frozen=True)
class ImportanceOptions:
    methods: tuple[str, ...] = (
        "gradient", "fisher", "ablation", "mean-ablation", "confidence", "entropy",
    )  # fmt: skip
    lengths: str | tuple[int, ...] = "L"
    batch_size: int = 64
    n_batches: int = 2
    seed: int = 2469  # the prune step's first importance split (seed + 1 there): the same data


def run(ctx: StepContext, opts: ImportanceOptions) -> dict[str, pd.DataFrame]:
    """`probe.pruning.importance.head_importance` of every head by each estimator, on one set
    of task data (by default the prune step's first importance split)."""
    form = form_for(ctx.model.cfg.arch)
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    batches = list(
        eval_batches(ctx.task, form, lengths, opts.batch_size, opts.n_batches, opts.seed)
    )
    tables = [head_importance(ctx.model, batches, m) for m in opts.methods]
    return {"importance": pd.concat(tables, ignore_index=True)}


def check(opts: ImportanceOptions) -> None:
    for method in opts.methods:
        ESTIMATORS.get(method)


def agreement(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    """Spearman rank correlation between every pair of estimators, per cell, then averaged
    over the cells of each arm (and over arms in the heatmap)."""
    parts = []
    for (cell, arm, seed), g in table.groupby(["cell", "arm", "seed"], sort=False):
        rho = importance_correlations(g[["layer", "head", "method", "value"]])
        parts.append(rho.assign(cell=cell, arm=arm, seed=seed))
    rho = pd.concat(parts, ignore_index=True)
    rho = rho[rho["method"] != rho["other"]].rename(columns={"rho": "value"})
    rep.heading("Do the importance estimators agree?")
    low = " and ".join(e.name for e in ESTIMATORS if e.low_is_important)
    rep.paragraph(
        "Spearman rank correlation between the estimators' head rankings, per model, averaged "
        f"over seeds and arms ({low} is negated, so a positive rho always means agreement on "
        "which heads matter). Gradient and Fisher are Michel et al. 2019's and Kwon et al. "
        "2022's gate sensitivities; ablation and mean-ablation measure the loss with the head "
        "removed; confidence (Voita et al. 2019) and entropy read the attention pattern only."
    )
    mean = rho.groupby(["method", "other"], as_index=False)["value"].mean()
    methods = list(dict.fromkeys(table["method"]))
    grid = mean.pivot(index="method", columns="other", values="value").reindex(methods)
    grid = grid[[m for m in methods if m in grid.columns]]
    cells = grid.stack().rename("mean").reset_index()
    fig = plots.heatmap(cells, "method", "other", row_order=methods, vmin=-1, vmax=1,
                        title="Spearman rho")  # fmt: skip
    rep.figure(fig, "importance_agreement.png", "Rank agreement between importance estimators")
    by_arm = over_seeds(rho[rho["other"] == "gradient"], ["arm", "method"])
    wide = by_arm.assign(text=by_arm.apply(row_ci, axis=1))
    wide = wide.pivot_table(index="arm", columns="method", values="text", aggfunc="first")
    rep.table(arm_sorted(wide.reset_index(), order), "importance_agreement.csv", data=rho,
              caption="Spearman rho with the gradient ranking, per arm: "
              f"{interval_words(by_arm['n_seeds'])}.")  # fmt: skip
    with_gradient = mean[mean["other"] == "gradient"].set_index("method")["value"]
    text = ", ".join(f"{m} {v:.2f}" for m, v in with_gradient.items())
    finding = f"Rank agreement with gradient importance (mean Spearman rho): {text}."
    rep.bullets([finding])
    return [finding]


def survivors(rep: MarkdownReport, importance: pd.DataFrame, roles: pd.DataFrame,
              order: list[str], method: str = "gradient") -> list[str]:  # fmt: skip
    """Role scores of the most important half of the heads (by `method`) against the rest: each
    head's strongest role score, compared with a one-sided Mann-Whitney test pooled over seeds,
    and the share with a role (a score >= DOMINANT)."""
    imp = importance[importance["method"] == method]
    if imp.empty or roles.empty:
        return []
    keys = ["cell", "layer", "head"]
    rank = imp.assign(rank=imp.groupby("cell")["value"].rank(ascending=False, pct=True))
    role = roles.groupby(keys, as_index=False)["value"].max().rename(columns={"value": "best"})
    best_role = roles.loc[roles.groupby(keys)["value"].idxmax(), [*keys, "statistic"]]
    heads = rank.merge(role, on=keys).merge(best_role.rename(columns={"statistic": "role"}),
                                            on=keys)  # fmt: skip
    heads = heads.assign(kept=heads["rank"] <= KEEP)
    rep.heading("Roles of the heads that survive")
    rep.paragraph(
        f"The most important {100 * KEEP:g}% of each model's heads by {method} importance "
        "survive. Each head's strongest role score (previous-token, positional, sink or "
        "induction: the mean attention it puts where that role looks) is compared between the "
        "survivors and the heads pruned away; if specialised heads carry the task (Voita et al. "
        "2019), survivors score higher. One-sided Mann-Whitney test on the heads pooled over "
        f"seeds; 'with a role' counts scores >= {DOMINANT}."
    )
    rows, findings = [], []
    for arm, g in heads.groupby("arm", sort=False):
        kept, gone = g[g.kept], g[~g.kept]
        p = stats.mannwhitneyu(kept["best"], gone["best"], alternative="greater").pvalue
        common = kept["role"].value_counts().idxmax()
        rows.append({
            "arm": arm, "survivors: mean strongest role score": kept["best"].mean(),
            "pruned: mean strongest role score": gone["best"].mean(),
            "survivors with a role": f"{int((kept.best >= DOMINANT).sum())} of {len(kept)}",
            "pruned with a role": f"{int((gone.best >= DOMINANT).sum())} of {len(gone)}",
            "survivors' commonest role": common, "p (one-sided)": p,
        })  # fmt: skip
        findings.append(f"{arm}: strongest role score {kept['best'].mean():.2f} for the "
                        f"surviving heads against {gone['best'].mean():.2f} for the pruned "
                        f"(Mann-Whitney p = {p:.2g})")  # fmt: skip
    rep.table(arm_sorted(pd.DataFrame(rows), order), "survivor_roles.csv", data=heads,
              digits=3)  # fmt: skip
    finding = "Roles of the heads that survive pruning: " + "; ".join(findings) + "."
    rep.bullets([finding])
    return [finding]


STEP = Step(
    "importance", ImportanceOptions, run, ("importance",),
    "every head's importance by each estimator (for their agreement)", check,
    sections=(
        Section("importance_agreement", 90, ("importance",),
                lambda rep, given: agreement(rep, given.tables["importance"], given.order)),
        Section("survivor_roles", 100, ("importance", "roles"),
                lambda rep, given: survivors(rep, given.tables["importance"],
                                             given.tables["roles"], given.order)),
    ),
)  # fmt: skip
