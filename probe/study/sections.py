"""The result sections of a study report. Each takes the report, the study's tables and the arm
order, writes its tables (CSV) and figures (PNG) beside the report, and returns the findings it
wants stated at the top of the report."""

from __future__ import annotations

import pandas as pd

from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study import summary
from probe.study.spec import Reference
from probe.study.stats import fmt_ci

FIT = 0.95  # in-distribution exact match counted as fitting the training lengths
LEARNED = 0.5  # ... and as having learned the task at all (tasks below it are not ranked)


def _ci(row) -> str:
    return fmt_ci(row["mean"], row["low"], row["high"])


def _wide(table: pd.DataFrame, order: list[str], extra: dict[str, pd.Series] | None = None):
    """arm x task grid of 'mean [low, high]' strings, arms in `order`."""
    cells = table.assign(text=table.apply(_ci, axis=1))
    wide = cells.pivot_table(index="arm", columns="task", values="text", aggfunc="first")
    wide = wide.reindex([a for a in order if a in wide.index])
    for name, column in (extra or {}).items():
        wide[name] = column.reindex(wide.index)
    return wide.reset_index()


def _seed_note(table: pd.DataFrame) -> str:
    n = int(table["n_seeds"].min()) if len(table) else 0
    if n < 2:
        return "One seed per cell, so the numbers are single runs with no confidence interval."
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
    rep.table(_wide(seen, order), "in_distribution.csv", data=seen)
    misfits = seen[seen["mean"] < FIT]
    if misfits.empty:
        findings.append(f"Every arm fits the training lengths (exact match >= {FIT} on each task).")
    elif len(misfits) == len(seen):
        findings.append(f"No arm fits the training lengths (exact match < {FIT} everywhere, at "
                        f"most {seen['mean'].max():.2f}): train longer or larger before reading "
                        "the unseen lengths.")  # fmt: skip
    else:
        names = "; ".join(f"{r.arm} on {r.task} ({r.mean:.2f})" for r in misfits.itertuples())
        findings.append(f"Not fitted at the training lengths (exact match < {FIT}): {names}. "
                        "Their unseen-length numbers say little about generalization.")  # fmt: skip
    rep.paragraph(findings[-1])

    rep.heading("Accuracy against length")
    rep.paragraph(
        "Lines are means over seeds, bands 95% bootstrap intervals; the grey band is the "
        "training range and the dashed line marks L, the longest training length."
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
    ranks, note = _mrr(table, seen)
    over_tasks = table.groupby("arm")["mean"].mean()
    rep.paragraph(
        "Exact match averaged over the lengths longer than L; 'all tasks' is the mean over tasks "
        "and MRR the mean reciprocal rank of the arm across tasks (1 = best on every task)."
        f"{note} " + _seed_note(table)
    )
    wide = _wide(table, order, {"all tasks": over_tasks.round(2),
                                "MRR": ranks.set_index("arm")["mrr"].round(2)})  # fmt: skip
    rep.table(wide, "unseen_lengths.csv", data=table)
    rep.table(ranks, "mean_reciprocal_rank.csv", caption="Rank of each arm per task.")
    token = summary.by_arm_task(summary.metric_rows(eval_table, "token_accuracy").pipe(
        lambda d: d[summary.unseen(d)]))  # fmt: skip
    rep.paragraph("Token accuracy at unseen lengths (partial credit):")
    rep.table(_wide(token, order), "unseen_token_accuracy.csv", data=token)
    if table["task"].nunique() > 1:
        fig = plots.heatmap(table, "arm", "task", row_order=order,
                            title="Exact match at unseen lengths (mean over seeds)")  # fmt: skip
        rep.figure(fig, "unseen_heatmap.png", "Exact match at unseen lengths, arm by task")
    best = ranks.iloc[0]
    if over_tasks.max() < 0.05:
        findings.append("No arm generalizes beyond L: exact match at unseen lengths stays below "
                        "0.05 everywhere.")  # fmt: skip
    else:
        findings.append(
            f"Best at unseen lengths: {best['arm']} (MRR {best['mrr']:.2f}; mean exact match over "
            f"tasks {over_tasks[best['arm']]:.2f}); worst: {ranks.iloc[-1]['arm']} "
            f"(MRR {ranks.iloc[-1]['mrr']:.2f})."
        )
    rep.paragraph(findings[-1])
    return findings


def _mrr(unseen_summary: pd.DataFrame, seen_summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Mean reciprocal rank over the tasks some arm learns (all when none does), and a sentence
    naming the tasks left out."""
    tasks = sorted(unseen_summary["task"].unique())
    learned = [t for t in summary.fitted_tasks(seen_summary, LEARNED) if t in tasks]
    if not learned or len(learned) == len(tasks):
        return summary.mean_reciprocal_rank(unseen_summary), ""
    ranks = summary.mean_reciprocal_rank(unseen_summary[unseen_summary["task"].isin(learned)])
    left_out = ", ".join(t for t in tasks if t not in learned)
    return ranks, (f" MRR leaves out {left_out}: no arm reaches {LEARNED} exact match there "
                     "even at the training lengths, so the arms' order is noise.")  # fmt: skip


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
    shown = stats.assign(text=stats.apply(_ci, axis=1),
                         fraction=stats["fraction"].map(lambda f: f"{100 * f:g}%"))  # fmt: skip
    wide = shown.pivot_table(index=["arm", "method"], columns="fraction", values="text",
                             aggfunc="first", sort=False).reset_index()  # fmt: skip
    wide = wide.sort_values("arm", key=lambda s: s.map({a: i for i, a in enumerate(order)}))
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
    if loss.empty:
        return []
    rep.heading("Training")
    rep.figure(
        plots.training_curves(loss, order=order),
        "training_loss.png",
        "Training loss against step (log scale; moving average over 9 logged steps)",
    )
    rep.data(loss, "training_loss.csv", "Smoothed training loss per seed.")
    final = summary.final_loss(table)
    rep.table(_wide(final, order), "final_loss.csv", data=final,
              caption="Last logged training loss.")  # fmt: skip
    return []


def reference(rep: MarkdownReport, eval_table: pd.DataFrame, ref: Reference) -> list[str]:
    exact = summary.metric_rows(eval_table, ref.metric)
    which = summary.unseen(exact) if ref.lengths == "unseen" else summary.seen(exact)
    ours = summary.by_arm_task(exact[which])
    rows, verdicts = summary.compare(ours, ref)
    rep.heading("Comparison with published results")
    rep.paragraph(f"**{ref.source}**" + (f": {ref.setting}." if ref.setting else "."))
    if ref.notes:
        rep.paragraph(ref.notes)
    if rows.empty:
        rep.paragraph("None of the published tasks and encodings is in this run.")
        return ["No overlap with the published results in this run."]
    shown = rows.assign(ours=rows.apply(_ci, axis=1))
    rep.table(shown[["task", "arm", "published_as", "ours", "published"]],
              "reference_comparison.csv", data=rows)  # fmt: skip
    findings = [_task_verdict(v) for v in verdicts.itertuples()]
    seen = summary.by_arm_task(exact[summary.seen(exact)])
    ranks, note = _mrr(ours, seen)
    mrr_table, mrr_verdict = summary.compare_mrr(ranks, ref)
    if not mrr_table.empty:
        rep.table(mrr_table, "reference_mrr.csv",
                  caption="Mean reciprocal rank across tasks, ours (these tasks) and "
                          f"published (all of theirs).{note}")  # fmt: skip
        findings.append(f"Ranking across tasks (MRR): {mrr_verdict}.")
    misfit = sorted(set(seen.loc[seen["mean"] < FIT, "arm"]) & set(rows["arm"]))
    if misfit:
        findings.append(f"Caution: {', '.join(misfit)} did not fit every training length here, "
                        "so their unseen-length scores are not a fair comparison.")  # fmt: skip
    rep.bullets(findings)
    short = [f"{v.verdict.split(' (')[0]} on {v.task}" for v in verdicts.itertuples()]
    if mrr_verdict:
        short.append(f"ranking across tasks {mrr_verdict}")
    return [f"Against {ref.source.split(',')[0]}: {'; '.join(short)}."]


def _task_verdict(v) -> str:
    if v.pairs_ordered == 0:
        return (f"{v.task}: cannot be compared, every encoding scores the same here "
                f"(the paper's best is {v.best_published}).")  # fmt: skip
    return (
        f"{v.task}: {v.verdict} with the paper (Spearman rho {v.spearman:.2f} over {v.n_arms} "
        f"encodings; {v.pairs_agree} of {v.pairs_ordered} ordered pairs in the same order, "
        f"{v.pairs_tied_in_ours} tied here; best here {v.best_ours}, there {v.best_published})."
    )
