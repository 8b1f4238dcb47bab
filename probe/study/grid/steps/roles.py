"""roles: each head's previous-token, induction, positional and sink score (`roles`), and the
report section on the share of heads with a role."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.analysis.roles import DOMINANT, head_roles
from probe.measure.evaluate import eval_batches, form_for
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext, resolve_lengths
from probe.study.verdicts.stats import interval_words, over_seeds, row_ci, seed_counts
from probe.study.verdicts.summary import arm_sorted


@dataclass(frozen=True)
class RolesOptions:
    lengths: str | tuple[int, ...] = "L"  # task lengths whose data give the attention profiles
    batch_size: int = 32
    n_batches: int = 1
    period: int = 8  # induction: length of the random sequence that is repeated
    seed: int = 531


def run(ctx: StepContext, opts: RolesOptions) -> dict[str, pd.DataFrame]:
    """`probe.analysis.roles.head_roles`: every head's previous-token, induction, positional and
    sink score (mean attention probabilities in [0, 1]) on the task's data."""
    form = form_for(ctx.model.cfg.arch)
    lengths = resolve_lengths(opts.lengths, ctx.train_max)
    batches = list(
        eval_batches(ctx.task, form, lengths, opts.batch_size, opts.n_batches, opts.seed)
    )
    table = head_roles(ctx.model, batches, period=opts.period, seed=opts.seed)
    return {"roles": table}


def section(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    """Per arm: the share of heads whose score for each role reaches DOMINANT (half the head's
    attention; the same bar for every role, not `has_role`'s per-role thresholds), and for any
    role. The report words it "has a role", as it has since it was first published."""
    if table.empty:
        return []
    rep.heading("Head roles")
    seeds = seed_counts(table, ["arm"])
    rep.paragraph(
        "Each head's role scores are mean attention probabilities: on the previous token, on a "
        "fixed relative offset (positional), on the first token (sink), and on the token after "
        "the previous occurrence of the current one in a repeated random sequence (induction). "
        f"A head has a role when its score reaches {DOMINANT}. Shares are of all heads of "
        f"the model, {interval_words(seeds)}."
    )
    keys = ["cell", "arm", "seed", "layer", "head"]
    heads = table.pivot_table(index=keys, columns="statistic", values="value").reset_index()
    role_names = [c for c in heads.columns if c not in keys]
    has = heads[role_names].ge(DOMINANT).assign(any=lambda d: d.any(axis=1))
    shares = pd.concat([heads[["cell", "arm", "seed"]], has.astype(float)], axis=1)
    per_cell = shares.groupby(["cell", "arm", "seed"], as_index=False).mean(numeric_only=True)
    long = per_cell.melt(id_vars=["cell", "arm", "seed"], var_name="role", value_name="value")
    stats = over_seeds(long, ["arm", "role"])
    wide = stats.assign(text=stats.apply(row_ci, axis=1)).pivot_table(
        index="arm", columns="role", values="text", aggfunc="first"
    )
    wide = wide[["any", *role_names]].reset_index()
    rep.table(arm_sorted(wide, order), "roles.csv", data=table,
              caption="Share of heads with each role.")  # fmt: skip
    rep.figure(plots.heatmap(stats, "arm", "role", row_order=order, title="share of heads"),
               "roles.png", "Share of heads with each role, per arm")  # fmt: skip
    anyrole = arm_sorted(stats[stats["role"] == "any"], order)
    text = ", ".join(f"{r.arm} {100 * r.mean:.0f}%" for r in anyrole.itertuples())
    finding = f"Heads with a role (some score >= {DOMINANT}): {text}."
    rep.bullets([finding])
    return [finding]


STEP = Step(
    "roles", RolesOptions, run, ("roles",),
    "each head's previous-token, induction, positional and sink score",
    sections=(Section("roles", 60, ("roles",),
                      lambda rep, given: section(rep, given.tables["roles"], given.order)),),
)  # fmt: skip
