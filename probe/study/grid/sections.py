"""The result sections of a study report. Each takes the report, the study's tables and the arm
order, writes its tables (CSV) and figures (PNG) beside the report, and returns the findings it
wants stated at the top of the report."""

from __future__ import annotations

import pandas as pd

from probe.references import Published, published
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid import summary
from probe.study.grid.spec import Reference
from probe.study.verdicts.published import (
    ALPHA,
    MIN_ARMS,
    Comparison,
    compare_ranking,
    seed_resamples,
)
from probe.study.verdicts.stats import band_words, fmt_vs, row_ci, seed_counts
from probe.words import counted

FIT = summary.FIT
FIT_AT = summary.FIT - summary.FIT_TOLERANCE  # what summary.fitted compares means with


def _wide(table: pd.DataFrame, order: list[str], extra: dict[str, pd.Series] | None = None,
          threshold: float | None = None):  # fmt: skip
    """arm x task grid of 'mean [low, high]' strings, arms in `order` (each mean on the same side
    of `threshold` as printed, when the means are tested against one)."""
    cells = table.assign(text=table.apply(row_ci, axis=1, threshold=threshold))
    wide = cells.pivot_table(index="arm", columns="task", values="text", aggfunc="first")
    wide = wide.reindex([a for a in order if a in wide.index])
    for name, column in (extra or {}).items():
        wide[name] = column.reindex(wide.index)
    return wide.reset_index()


def _seed_note(table: pd.DataFrame) -> str:
    n = int(table["n_seeds"].min()) if len(table) else 0
    most = int(table["n_seeds"].max()) if len(table) else 0
    if most < 2:
        return "One seed per cell, so the numbers are single runs with no confidence interval."
    if n < 2:
        return (f"Each entry is the mean over 1 to {most} seeds, with a 95% bootstrap confidence "
                "interval (scipy.stats.bootstrap, percentile) where there are two or more; "
                "per-seed values are in the CSV.")  # fmt: skip
    return (f"Each entry is the mean over {n} seeds with a 95% bootstrap confidence interval "
            "(scipy.stats.bootstrap, percentile); per-seed values are in the CSV.")  # fmt: skip


def accuracy(rep: MarkdownReport, eval_table: pd.DataFrame, order: list[str]) -> list[str]:
    findings = []
    exact = summary.metric_rows(eval_table, "exact_match")
    rows = pd.concat([summary.metric_rows(eval_table, m).assign(metric=m)
                      for m in ("exact_match", "token_accuracy")])  # fmt: skip

    rep.heading("In-distribution accuracy")
    seen = summary.by_arm_task(exact[summary.seen(exact)])
    rep.paragraph(
        "Exact match at the training lengths (L_min to L), where every encoding should fit. "
        + _seed_note(seen)
    )
    rep.table(_wide(seen, order, threshold=FIT_AT), "in_distribution.csv", data=seen)
    misfits = seen[~summary.fitted(seen)]
    if misfits.empty:
        findings.append(f"Every arm fits the training lengths (exact match >= {FIT} on each task).")
    elif len(misfits) == len(seen):
        findings.append(f"No arm fits the training lengths (exact match < {FIT} everywhere, at "
                        f"most {fmt_vs(seen['mean'].max(), FIT_AT)}): train longer or larger "
                        "before reading the unseen lengths.")  # fmt: skip
    else:
        names = "; ".join(f"{r.arm} on {r.task} ({fmt_vs(r.mean, FIT_AT)})"
                          for r in misfits.itertuples())  # fmt: skip
        findings.append(f"Not fitted at the training lengths (exact match < {FIT}): {names}. "
                        "Their unseen-length numbers say little about generalization.")  # fmt: skip
    rep.paragraph(findings[-1])

    rep.heading("Accuracy against length")
    drawn = seed_counts(rows, ["metric", "arm", "task", "length"], rows=True)  # per point
    rep.paragraph(
        f"{band_words(drawn)}; the grey band is the training range and the dashed line marks L, "
        "the longest training length."
    )
    for metric, label in (("exact_match", "exact match"), ("token_accuracy", "token accuracy")):
        fig = plots.length_curves(rows[rows["metric"] == metric], label, order=order)
        rep.figure(fig, f"{metric}_by_length.png", f"{label.capitalize()} against task length")
    rep.data(rows, "accuracy_by_length.csv", "Per-seed accuracy at every length.")

    unseen_rows = exact[summary.unseen(exact)]
    if unseen_rows.empty:
        return findings
    rep.heading("Unseen lengths")
    table = summary.by_arm_task(unseen_rows)
    ranks = summary.fitted_ranks(table, seen)
    over_tasks = table.groupby("arm")["mean"].mean()
    rep.paragraph(
        "Exact match averaged over the lengths longer than L; 'all tasks' is the mean over tasks "
        "and MRR the mean reciprocal rank of the arm across tasks (1 = best on every task). Only "
        f"arms that fit a task (exact match >= {FIT} at its training lengths) are ranked on it; "
        "an arm earns nothing on a task it does not fit, and tasks no arm fits are not ranked. "
        + _seed_note(table)
    )
    wide = _wide(table, order, {"all tasks": over_tasks.round(2),
                                "MRR": ranks.set_index("arm")["mrr"].round(2)})  # fmt: skip
    rep.table(wide, "unseen_lengths.csv", data=table)
    rep.table(ranks, "mean_reciprocal_rank.csv",
              caption="Rank of each arm per task among the arms that fit it.")  # fmt: skip
    token = summary.by_arm_task(summary.metric_rows(eval_table, "token_accuracy").pipe(
        lambda d: d[summary.unseen(d)]))  # fmt: skip
    rep.paragraph("Token accuracy at unseen lengths (partial credit):")
    rep.table(_wide(token, order), "unseen_token_accuracy.csv", data=token)
    if table["task"].nunique() > 1:
        fig = plots.heatmap(table, "arm", "task", row_order=order,
                            title="Exact match at unseen lengths (mean over seeds)")  # fmt: skip
        rep.figure(fig, "unseen_heatmap.png", "Exact match at unseen lengths, arm by task")
    best = ranks.iloc[0]
    if best["mrr"] == 0:
        findings.append("No arm fits a task at its training lengths, so none is ranked.")
    elif over_tasks.max() < 0.05:
        findings.append("No arm generalizes beyond L: exact match at unseen lengths stays below "
                        "0.05 everywhere.")  # fmt: skip
    else:
        findings.append(
            f"Best at unseen lengths among the fitted arms: {best['arm']} (MRR {best['mrr']:.2f}; "
            f"mean exact match over tasks {over_tasks[best['arm']]:.2f}); last: "
            f"{ranks.iloc[-1]['arm']} (MRR {ranks.iloc[-1]['mrr']:.2f})."
        )
    rep.paragraph(findings[-1])
    return findings


def attention(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    statistic = "normalized_entropy"
    if statistic not in set(table["statistic"]):
        statistic = "entropy"
    rows = summary.entropy_by_length(table, statistic)
    if rows.empty:
        return []
    label = "normalized entropy (H / log n)" if statistic == "normalized_entropy" else "entropy"
    rep.heading("Attention entropy against length")
    rep.paragraph(
        f"Mean {label} over every layer and head, per arm. Flat lines mean attention stays as "
        "focused at unseen lengths as at the training lengths; rising lines mean it spreads out."
    )
    fig = plots.length_curves(rows, label, order=order, ylim=None)
    rep.figure(fig, f"{statistic}_by_length.png", f"Attention {label} against task length")
    at = rows.groupby(["arm", "length"])["value"].mean().reset_index()
    change = []
    for arm, part in at.groupby("arm"):
        first, last = part.sort_values("length").iloc[[0, -1]]["value"]
        change.append({"arm": arm, "shortest": first, "longest": last, "change": last - first})
    change = pd.DataFrame(change).set_index("arm").reindex(order).dropna().reset_index()
    rep.table(change, f"{statistic}_change.csv", caption=f"{label} at the shortest and longest "
              "recorded lengths (mean over tasks and seeds).", digits=3)  # fmt: skip
    rep.data(rows, f"{statistic}_by_length.csv", "Per-seed values at every length.")
    moves = ", ".join(f"{r.arm} {r.shortest:.2f} to {r.longest:.2f}" for r in change.itertuples())
    return [f"Attention {label} from the shortest to the longest recorded length: {moves}."]


def pruning(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    rows = summary.pruning_rows(table, "exact_match")
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
    rep.table(wide, "pruning.csv", data=rows, caption=_seed_note(stats))
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


def training(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    loss = summary.training_loss(table, smooth=9)
    if loss.empty or loss["step"].nunique() < 2:  # nothing to draw (a model trained one step)
        return []
    rep.heading("Training")
    rep.figure(
        plots.training_curves(loss, order=order),
        "training_loss.png",
        "Training loss against step (log scale; moving average over 9 logged steps)",
    )
    rep.data(loss, "training_loss.csv", "Smoothed training loss per seed.")
    stats = summary.attention_over_training(table)
    if not stats.empty:
        shown = [m for m in ("normalized_entropy", "max_logit", "p_max") if m in set(stats.metric)]
        drawn = stats[stats["metric"].isin(shown)]
        counts = seed_counts(drawn, ["metric", "arm", "step"], rows=True)
        rep.figure(plots.attention_training_curves(stats, shown, order=order),
                   "attention_during_training.png",
                   "Attention statistics during training, averaged over every head "
                   f"({band_words(counts, short=True)})")  # fmt: skip
        rep.data(stats, "attention_during_training.csv",
                 "Per-cell attention statistics by step (mean over heads).")  # fmt: skip
    final = summary.final_loss(table)
    rep.table(_wide(final, order), "final_loss.csv", data=final,
              caption="Last logged training loss.")  # fmt: skip
    return []


def reference(rep: MarkdownReport, eval_table: pd.DataFrame, ref: Reference) -> list[str]:
    """The study's ranking against the paper's, by the rules of `probe.study.verdicts.published`."""
    paper = published(ref.id)
    exact = summary.metric_rows(eval_table, ref.metric)
    seen = summary.by_arm_task(exact[summary.seen(exact)])
    which = summary.unseen(exact) if ref.lengths == "unseen" else summary.seen(exact)
    per_seed = exact[which].groupby(["arm", "task", "seed"], as_index=False)["value"].mean()
    rep.heading("Comparison with published results")
    rep.paragraph(
        f"**{paper.cite}.** Setting: {paper.setting} ({paper.setting_source}). Finding: "
        f"{paper.claim} ({paper.claim_source})."
    )
    if ref.notes:
        rep.paragraph(ref.notes)
    if paper.values:
        quoted = pd.DataFrame([{"published": v.what, "value": v.value, "source": v.source,
                                "approximate": "yes" if v.approximate else "no"}
                               for v in paper.values])  # fmt: skip
        rep.table(quoted, "reference_values.csv", caption="Numbers quoted from the paper.")
    if paper.ranking is None:
        return []
    ranks = {a: r for a, r in paper.ranking.ranks.items() if a in set(per_seed["arm"])}
    order = " > ".join(
        " ~ ".join(paper.name(a) for a in sorted(ranks, key=str) if ranks[a] == r)
        for r in sorted(set(ranks.values()))
    )
    rep.paragraph(
        f"The paper's ranking ({paper.ranking.what}): {order}. Source: {paper.ranking.source}"
        f"{' (approximate)' if paper.ranking.approximate else ''}. The paper reports per-task "
        "results as plots, so each of our tasks is compared with this aggregate ranking."
    )
    comparisons = compare_ranking(per_seed, seen, ranks)
    rep.paragraph(
        f"Rules: on each task only the arms that fit its training lengths (exact match >= {FIT}) "
        "are ranked, by exact match at unseen lengths, and only over the encodings the paper "
        f"ranks; with fewer than {MIN_ARMS} such arms there is no verdict. Kendall's S "
        "(concordant minus discordant pairs) is tested by exact permutation (every ordering of "
        f"our scores over the arms); 'agrees' needs p <= {float(ALPHA):g} and S > 0 in at least "
        "97.5% of bootstrap resamples of our seeds ('disagrees' the mirror image), anything "
        "else is 'inconclusive'. Across tasks the score is the mean reciprocal rank over the "
        "tasks some arm fits, among the arms that fit every one of them."
    )
    table = pd.DataFrame([_comparison_row(c, paper) for c in comparisons])
    rep.table(table, "reference_comparison.csv")
    verdicts = "; ".join(f"{c.scope} {_short(c)}" for c in comparisons)
    finding = _plain_finding(per_seed, seen, paper)
    rep.bullets([finding, f"Against the paper's ranking: {verdicts}."])
    return [finding, f"Against the ranking of {paper.short}: {verdicts}."]


def _short(c: Comparison) -> str:
    if c.s is None:
        return f"too few to compare ({len(c.arms)} fitted encodings)"
    return f"{c.verdict} (tau {c.tau:.2f}, p {float(c.p_agree):.3f})"


def _comparison_row(c: Comparison, paper: Published) -> dict:
    def fraction(p) -> str:
        return "" if p is None else f"{p.numerator}/{p.denominator}"

    return {
        "compared": c.scope,
        "ours, best first": ", ".join(
            f"{paper.name(a)} {v:.2f}" for a, v in zip(c.arms, c.ours, strict=True)
        ),
        "paper's ranks": ", ".join(f"{r:g}" for r in c.published_rank),
        "not fitted here": ", ".join(paper.name(a) for a in c.left_out) or "–",
        "S": "" if c.s is None else c.s,
        "tau-b": "" if c.tau is None else round(c.tau, 2),
        "p (agree)": fraction(c.p_agree),
        "p (disagree)": fraction(c.p_disagree),
        "S, 95% over seeds": "" if c.s_low is None else f"[{c.s_low}, {c.s_high}]",
        "verdict": c.verdict,
    }


def _plain_finding(per_seed: pd.DataFrame, seen: pd.DataFrame, paper: Published) -> str:
    """One sentence: which arm generalizes best here, and whether that matches the paper."""
    fit = seen[summary.fitted(seen)]
    tasks = sorted(set(per_seed["task"]) & set(fit["task"]))  # the tasks some arm fits
    everywhere = [a for a, g in fit.groupby("arm") if set(tasks) <= set(g["task"])]
    if not tasks or not everywhere:
        return "No arm fits every task here, so no arm can be called best at unseen lengths."
    means = per_seed.groupby(["arm", "task"])["value"].mean()
    scores = {t: {a: float(means[(a, t)]) for a in everywhere} for t in tasks}
    mrr = summary.reciprocal_ranks(scores)
    best = max(sorted(mrr), key=lambda a: mrr[a])
    firsts = sum(max(sorted(everywhere), key=lambda a, t=t: scores[t][a]) == best for t in tasks)
    share = _first_share(per_seed, everywhere, tasks, best)
    ranks = paper.ranking.ranks
    top = min(ranks.values())
    paper_first = [a for a, r in ranks.items() if r == top]
    if best in paper_first:
        verdict = "as in the paper, which also puts it first"
    elif best in ranks:
        verdict = (f"unlike the paper, where {paper.name(best)} ranks {ranks[best]:g} and "
                   f"{' and '.join(paper.name(a) for a in paper_first)} first")  # fmt: skip
    else:
        verdict = "an encoding the paper did not test"
    missing = [a for a in paper_first if a not in everywhere and a != best]
    extra = ""
    if missing:
        extra = (
            f" ({paper.name(missing[0])} {_status(missing[0], fit, tasks)}, so it is not ranked)"
        )
    return (
        f"At this size on a CPU, {best} generalizes best to unseen lengths among the "
        f"{counted(len(everywhere), 'arm')} that fit every task some arm fits "
        f"({', '.join(everywhere)}): "
        f"first on {firsts} of {counted(len(tasks), 'task')} and first by mean reciprocal rank in "
        f"{share:.0%} of bootstrap resamples of the seeds, {verdict}{extra}."
    )


def _status(arm: str, fit: pd.DataFrame, tasks: list[str]) -> str:
    fitted_on = sorted(set(fit.loc[fit["arm"] == arm, "task"]) & set(tasks))
    if not fitted_on:
        return "fits none of the tasks here"
    return f"fits only {', '.join(fitted_on)} here"


def _first_share(per_seed: pd.DataFrame, arms: list[str], tasks: list[str], best: str) -> float:
    """The fraction of seed resamples in which `best` keeps the highest mean reciprocal rank."""
    hits = 0
    resamples = seed_resamples(per_seed[per_seed["arm"].isin(arms)])
    for r in resamples:
        mrr = summary.reciprocal_ranks({t: {a: float(r[(a, t)]) for a in arms} for t in tasks})
        hits += max(sorted(mrr), key=lambda a: mrr[a]) == best
    return hits / len(resamples)


def init_scaling(rep: MarkdownReport, table: pd.DataFrame) -> list[str]:
    """The sqrt(d_k) argument at initialization: one cell's table (every cell computes the same)."""
    from probe.report.attention_plots import scaling_init_figure

    first = table[table["cell"] == table["cell"].iloc[0]] if "cell" in table else table
    first = first[["d_k", "n", "score_scale", "statistic", "value"]]
    first = first.rename(columns={"score_scale": "scale"})
    rep.heading("At initialization: why sqrt(d_k)")
    rep.paragraph(
        "Scores q.k of independent unit-variance q and k have variance d_k; each scale multiplies "
        "them by 1/sqrt(d_k), 1 or 1/d_k. Measured on random vectors (no training)."
    )
    rep.figure(scaling_init_figure(first), "init_scaling.png", "Score variance, entropy, "
               "near-one-hot rows and softmax Jacobian against d_k")  # fmt: skip
    wanted = ["score_var", "normalized_entropy", "p_max_gt_0.9", "softmax_jacobian_norm"]
    n, d_k = int(first["n"].max()), int(first["d_k"].max())
    at = first[(first["n"] == n) & (first["d_k"] == d_k) & first["statistic"].isin(wanted)]
    wide = at.pivot_table(index="scale", columns="statistic", values="value").reset_index()
    rep.table(wide, "init_scaling.csv", data=first, digits=3,
              caption=f"At d_k = {d_k} and n = {counted(n, 'key', grouped=False)} per "
              "query.")  # fmt: skip
    rows = wide.set_index("scale")
    if {"sqrt", "none"} <= set(rows.index) and "p_max_gt_0.9" in rows:
        var, hot = rows["score_var"], 100 * rows["p_max_gt_0.9"]
        if "softmax_jacobian_norm" in rows:
            jac = rows["softmax_jacobian_norm"]
            rep.paragraph(
                f"The mean softmax Jacobian norm is not the gauge of vanishing gradients: unscaled "
                f"it is {jac['none']:.3f} against {jac['sqrt']:.3f} scaled, because it averages "
                "saturated rows (a one-hot row has a zero Jacobian) with rows split between a few "
                "keys (norms up to 0.5), and an evenly spread row has a small Jacobian too "
                f"(about 1/sqrt(n) = {n**-0.5:.3f}). The share of near-one-hot rows, "
                f"{hot['none']:.0f}% unscaled against {hot['sqrt']:.0f}% scaled, counts the rows "
                "whose gradient has vanished."
            )
        return [
            f"At initialization (d_k = {d_k}, n = {n}): unscaled scores have variance "
            f"{var['none']:.0f} and {hot['none']:.0f}% of softmax rows are near one-hot "
            f"(p_max > 0.9); scaled by 1/sqrt(d_k), variance {var['sqrt']:.2f} and "
            f"{hot['sqrt']:.0f}%."
        ]
    return []
