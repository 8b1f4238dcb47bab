"""Report sections of the studies of the paper's open questions (order, many heads, cost), in the
manner of `sections.py`: each writes its tables and figures beside the report and returns the
findings it wants stated at the top."""

from __future__ import annotations

import pandas as pd

from probe.analysis.roles import DOMINANT
from probe.references import published
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.grid.summary import arm_sorted
from probe.study.verdicts.stats import interval_words, over_seeds, row_ci, seed_counts
from probe.words import counted


def position_probe(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
    r2 = table[table["statistic"] == "r2"]
    if r2.empty:
        return []
    rep.heading("Where is each token? A linear probe for absolute position")
    rep.paragraph(
        "At every depth of the residual stream (0: the embeddings, d: the output of block d) a "
        "ridge regression is fit from each task symbol's hidden state to its absolute position, "
        "on data at the training lengths, and scored by R^2 on fresh data at each length (R^2 "
        "below 0 means worse than predicting the mean position). Special tokens are left out: "
        "their identity alone gives their position away."
    )
    rep.figure(plots.depth_curves(r2, "R^2 of the position probe", order=order),
               "position_probe.png", "Position probe R^2 against depth, per length")  # fmt: skip
    stats = over_seeds(r2, ["arm", "length", "depth"])
    wide = (
        stats.assign(text=stats.apply(row_ci, axis=1), depth=stats["depth"].map("depth {}".format))
        .pivot_table(index=["arm", "length"], columns="depth", values="text", aggfunc="first")
        .reset_index()
    )
    rep.table(arm_sorted(wide, order), "position_probe.csv", data=table,
              caption=f"R^2 per depth: {interval_words(stats['n_seeds'])}.")  # fmt: skip
    findings = []
    deepest = int(r2["depth"].max())
    for n, part in stats[stats["depth"] >= 1].groupby("length"):
        best = part.loc[part.groupby("arm")["mean"].idxmax()]
        best = arm_sorted(best, order)
        text = ", ".join(f"{r.arm} {r.mean:.2f} (depth {r.depth})" for r in best.itertuples())
        findings.append(
            f"Best position-probe R^2 at length {n} over depths 1 to {deepest}: {text}."
        )
    gaps = table[table["statistic"] == "permutation_gap"]
    if not gaps.empty:
        g = over_seeds(gaps, ["arm", "length"])
        g = g.assign(gap=g["mean"].map(lambda v: f"{v:.2g}"))[["arm", "length", "gap", "values"]]
        rep.table(arm_sorted(g, order), "permutation_gap.csv", data=gaps,
                  caption="Encoders: max |f(x[pi]) - f(x)[pi]| over the final hidden states for "
                  "a random permutation pi of the prompt (0 up to rounding: the encoder cannot "
                  "tell orders apart). Mean over seeds; per-seed values listed.")  # fmt: skip
        text = ", ".join(f"{r.arm} {r.gap}" for r in g.drop_duplicates("arm").itertuples())
        findings.append(f"Encoders' gap to permutation equivariance: {text}.")
    rep.bullets(findings)
    return findings


def roles(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> list[str]:
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


def _order_class(low: float, high: float) -> str:
    """What a slope's 95% interval says about the growth: O(n), O(n^2), or neither."""
    eps = 0.005  # the measured memory is exact: a degenerate interval at 2.00 is quadratic
    linear, quadratic = low - eps <= 1 <= high + eps, low - eps <= 2 <= high + eps
    if quadratic and not linear:
        return "quadratic"
    if linear and not quadratic:
        return "linear"
    if linear and quadratic:
        return "undetermined (the interval holds 1 and 2)"
    if high < 1:
        return "sub-linear"
    if low > 2:
        return "faster than quadratic"
    return "between linear and quadratic"


def _cost_answer(slopes: pd.DataFrame, min_n: int, max_n: int) -> str:
    def part(y: str) -> str:
        rows = slopes[slopes["y"] == y]
        return ", ".join(f"{r.method} n^{r.slope:.2f} ({r.growth.split(' (')[0]})"
                         for r in rows.itertuples())  # fmt: skip

    return (f"From n = {min_n} to {max_n}, peak memory grows as {part('peak_bytes')}, and time "
            f"as {part('seconds')} (log-log slopes, 95% intervals in the table)")  # fmt: skip


def attention_cost(rep: MarkdownReport, table: pd.DataFrame) -> list[str]:
    """Time and peak memory of one attention layer against sequence length, with log-log
    slopes over the longer half of the lengths (95% intervals) and what they say. The first
    finding is the answer in one sentence."""
    from probe.analysis.attention_cost import fit_slopes
    from probe.report.cost_plots import attention_cost_plot

    first = table[table["cell"] == table["cell"].iloc[0]]
    shape = first.iloc[0]
    rep.heading("Cost of one attention layer against sequence length")
    rep.paragraph(
        f"Random q, k, v of batch {shape['batch']}, {counted(int(shape['n_head']), 'head')} "
        "of width "
        f"{shape['d_head']} ({'causal' if shape['causal'] else 'bidirectional'}), on "
        f"{shape['device']}. explicit: softmax(QK^T / sqrt(d)) V with the n x n scores in "
        "memory; sdpa: torch's fused scaled_dot_product_attention; streaming_entropy: probe's "
        f"per-row statistics over key tiles of {first['tile'].max()} (online softmax, no n x n "
        "matrix); explicit_entropy: the same statistics from the full scores. Seconds are the "
        "median of the repeats after a warm-up call; peak memory is measured (allocations "
        "beyond the inputs, replayed from the profiler's events), not computed."
    )
    data = first.rename(columns={"seq_len": "n"})
    rep.figure(attention_cost_plot(data), "attention_cost.png",
               "Time and peak memory of one attention layer against n (log-log)")  # fmt: skip
    medians = first.groupby(["seq_len", "method"], sort=False).agg(
        seconds=("seconds", "median"), peak_mib=("peak_bytes", "median")
    )
    medians["peak_mib"] = medians["peak_mib"] / 2**20
    rep.table(medians.reset_index(), "attention_cost.csv", data=first, digits=4,
              caption="Median seconds and peak extra memory (MiB) per call; skipped sizes "
              "(predicted to exceed the memory) are absent.")  # fmt: skip
    lengths = sorted(first["seq_len"].unique())
    min_n = int(lengths[len(lengths) // 2 - 1]) if len(lengths) >= 4 else int(lengths[0])
    slopes = pd.concat([fit_slopes(data, y=y, min_n=min_n) for y in ("seconds", "peak_bytes")])
    slopes = slopes.assign(growth=[_order_class(lo, hi) for lo, hi in zip(
        slopes["low"], slopes["high"], strict=True)])  # fmt: skip
    shown = slopes[["method", "y", "slope", "low", "high", "points", "growth"]]
    rep.table(shown, "attention_cost_slopes.csv", digits=2,
              caption=f"Slope of log(median) against log(n) for n >= {min_n}, with its 95% "
              "interval (2: quadratic, 1: linear).")  # fmt: skip
    findings = [_cost_answer(slopes, min_n, int(lengths[-1]))]
    for y, what in (("peak_bytes", "Peak memory"), ("seconds", "Time")):
        part = slopes[slopes["y"] == y]
        text = "; ".join(f"{r.method} slope {r.slope:.2f} [{r.low:.2f}, {r.high:.2f}], {r.growth}"
                         for r in part.itertuples())  # fmt: skip
        findings.append(f"{what} against n (n >= {min_n}): {text}.")
    rep.bullets(findings)
    papers = [published(ref) for ref in ("vaswani2017-cost", "dao2022")]
    rep.paragraph(
        "What the papers say: "
        + " ".join(f"**{p.short}**: {p.claim} ({p.claim_source})." for p in papers)
    )
    rep.bullets([f"{p.short}: {p.cite}." for p in papers])
    return findings
