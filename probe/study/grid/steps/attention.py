"""attention: per-head attention statistics (entropy, max logit, ...) at each length
(`attention`), and the report sections that present them: entropy against length, and how
different the heads are."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.measure.evaluate import eval_batches, form_for
from probe.measure.observe import attention_stats, check_statistics
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.verdicts import summary
from probe.study.verdicts.stats import interval_words, over_seeds, row_ci
from probe.study.verdicts.summary import arm_sorted


@dataclass(frozen=True)
class AttentionOptions:
    lengths: str | tuple[int, ...] = "L,2L"  # lengths at which to record attention statistics
    statistics: tuple[str, ...] = (
        "entropy",
        "normalized_entropy",
        "p_max",
        "max_logit",
        "sink_mass",
        "attention_distance",
    )  # see probe.measure.streaming
    batch_size: int = 32
    n_batches: int = 1
    seed: int = 4321


def run(ctx: StepContext, opts: AttentionOptions) -> dict[str, pd.DataFrame]:
    form = form_for(ctx.model.cfg.arch)
    batches = [
        batch
        for n in resolve_lengths(opts.lengths, ctx.train_max)
        for batch in eval_batches(
            ctx.task, form, [n], opts.batch_size, opts.n_batches, opts.seed + n
        )
    ]
    table = attention_stats(ctx.model, batches, list(opts.statistics), progress=ctx.progress)
    return {"attention": table}


def check(opts: AttentionOptions) -> None:
    check_statistics(list(opts.statistics))


def entropy(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
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


def head_spread(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    """How different a model's heads are: the standard deviation of normalized entropy over its
    heads, per arm."""
    rows = table[table["statistic"] == "normalized_entropy"]
    if rows.empty or "head" not in rows:
        return []
    per_head = rows.groupby(["cell", "arm", "seed", "layer", "head"], as_index=False)[
        "value"
    ].mean()
    spread = per_head.groupby(["cell", "arm", "seed"], as_index=False)["value"].std(ddof=0)
    mean = per_head.groupby(["cell", "arm", "seed"], as_index=False)["value"].mean()
    stats = over_seeds(spread, ["arm"]).assign(kind="spread over heads")
    stats = pd.concat([stats, over_seeds(mean, ["arm"]).assign(kind="mean over heads")])
    rep.heading("How different are the heads?")
    rep.paragraph(
        "Normalized attention entropy (H / log n) of each head at the recorded lengths; its "
        "standard deviation over all heads of a model says how differently the heads attend "
        f"(0: every head alike). {interval_words(stats['n_seeds']).capitalize()}."
    )
    wide = stats.assign(text=stats.apply(row_ci, axis=1)).pivot_table(
        index="arm", columns="kind", values="text", aggfunc="first"
    )
    rep.table(arm_sorted(wide.reset_index(), order), "head_spread.csv", data=per_head,
              caption="Normalized entropy of the heads: mean and spread.")  # fmt: skip
    part = arm_sorted(stats[stats["kind"] == "spread over heads"], order)
    text = ", ".join(f"{r.arm} {r.mean:.2f}" for r in part.itertuples())
    finding = f"Spread of normalized attention entropy over heads: {text}."
    rep.bullets([finding])
    return [finding]


STEP = Step(
    "attention", AttentionOptions, run, ("attention",),
    "per-head attention statistics (entropy, max logit, ...) at each length", check,
    sections=(
        Section("attention_entropy", 40, ("attention",),
                lambda rep, given: entropy(rep, given.tables["attention"], given.order)),
        Section("head_spread", 50, ("attention",),
                lambda rep, given: head_spread(rep, given.tables["attention"], given.order)),
    ),
)  # fmt: skip
