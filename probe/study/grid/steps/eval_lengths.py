"""eval_lengths: exact match, token accuracy and loss at each task length (`eval`), and the
report sections that present it: accuracy in and beyond the training lengths, and the comparison
with the published result a study names in [reference]."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.measure.evaluate import evaluate
from probe.references import Published, published
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.definition import Reference
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.grid.steps.shared import FIT, FIT_AT, seed_note, wide_table
from probe.study.verdicts import summary
from probe.study.verdicts.published import (
    ALPHA,
    MIN_ARMS,
    Comparison,
    compare_ranking,
    seed_resamples,
)
from probe.study.verdicts.stats import band_words, fmt_vs, seed_counts
from probe.words import counted


@dataclass(frozen=True)
class EvalLengthsOptions:
    lengths: str | tuple[int, ...] = "1:2L"  # task lengths to evaluate at (L: longest trained)
    batch_size: int = 64  # examples per batch
    n_batches: int = 2  # batches per length
    seed: int = 1234  # evaluation data seed (the same data for every cell)


def run(ctx: StepContext, opts: EvalLengthsOptions) -> dict[str, pd.DataFrame]:
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    table = evaluate(
        ctx.model, ctx.task, lengths, batch_size=opts.batch_size, n_batches=opts.n_batches,
        seed=opts.seed, device=ctx.device, progress=ctx.progress,
    )  # fmt: skip
    return {"eval": table}


def accuracy(rep: MarkdownReport, eval_table: pd.DataFrame, order: list[str]) -> list[str]:
    findings = []
    exact = summary.metric_rows(eval_table, "exact_match")
    rows = pd.concat([summary.metric_rows(eval_table, m).assign(metric=m)
                      for m in ("exact_match", "token_accuracy")])  # fmt: skip

    rep.heading("In-distribution accuracy")
    seen = summary.by_arm_task(exact[summary.seen(exact)])
    rep.paragraph(
        "Exact match at the training lengths (L_min to L), where every encoding should fit. "
        + seed_note(seen)
    )
    rep.table(wide_table(seen, order, threshold=FIT_AT), "in_distribution.csv", data=seen)
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
        + seed_note(table)
    )
    wide = wide_table(table, order, {"all tasks": over_tasks.round(2),
                                "MRR": ranks.set_index("arm")["mrr"].round(2)})  # fmt: skip
    rep.table(wide, "unseen_lengths.csv", data=table)
    rep.table(ranks, "mean_reciprocal_rank.csv",
              caption="Rank of each arm per task among the arms that fit it.")  # fmt: skip
    token = summary.by_arm_task(summary.metric_rows(eval_table, "token_accuracy").pipe(
        lambda d: d[summary.unseen(d)]))  # fmt: skip
    rep.paragraph("Token accuracy at unseen lengths (partial credit):")
    rep.table(wide_table(token, order), "unseen_token_accuracy.csv", data=token)
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


STEP = Step(
    "eval_lengths", EvalLengthsOptions, run, ("eval",),
    "exact match, token accuracy and loss at each task length",
    sections=(
        Section("accuracy", 30, ("eval",),
                lambda rep, given: accuracy(rep, given.tables["eval"], given.order)),
        Section("reference", 120, ("eval",),
                lambda rep, given: reference(rep, given.tables["eval"], given.study.reference),
                applies=lambda study: study.reference is not None),
    ),
)  # fmt: skip
