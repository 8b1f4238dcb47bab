"""attention_cost: seconds and measured peak memory of one attention layer against sequence
length (`attention_cost`), and the report section whose first finding answers the cost study's
question."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.analysis.attention_cost import CostMethod, attention_cost, fit_slopes
from probe.errors import ProbeError
from probe.fields import choice
from probe.references import published
from probe.report.cost_plots import attention_cost_plot
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext
from probe.words import counted


@dataclass(frozen=True)
class AttentionCostOptions:
    ns: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)  # sequence lengths
    methods: tuple[str, ...] = ("explicit", "sdpa", "streaming_entropy")
    repeats: int = 3
    batch: int = 1
    causal: bool = True
    tile: int = 128  # keys per tile of the streaming statistics (fixed: memory n x tile)
    threads: int = 1  # torch CPU threads while measuring
    seed: int = 0


def run(ctx: StepContext, opts: AttentionCostOptions) -> dict[str, pd.DataFrame]:
    """`probe.analysis.attention_cost`: seconds and measured peak memory of one attention core
    (one layer's heads) at each sequence length, for each implementation, on random q, k, v of
    the cell's shape (its n_head and d_head; the trained weights play no part)."""
    cfg = ctx.model.cfg
    table = attention_cost(
        opts.ns, d_head=cfg.d_head, n_head=cfg.n_head, batch=opts.batch, causal=opts.causal,
        methods=opts.methods, repeats=opts.repeats, tile=opts.tile, seed=opts.seed,
        device=ctx.device, threads=opts.threads, progress=ctx.progress,
    )  # fmt: skip
    return {"attention_cost": table.rename(columns={"n": "seq_len"})}


def check(opts: AttentionCostOptions) -> None:
    for method in opts.methods:
        choice(CostMethod, method, "attention cost method")
    if not opts.ns or any(not isinstance(n, int) or n < 2 for n in opts.ns):
        raise ProbeError(f"[analysis.attention_cost] ns must be whole numbers >= 2, got {opts.ns}.")


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


def section(rep: MarkdownReport, table: pd.DataFrame) -> list[str]:
    """Time and peak memory of one attention layer against sequence length, with log-log
    slopes over the longer half of the lengths (95% intervals) and what they say. The first
    finding is the answer in one sentence."""
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


STEP = Step(
    "attention_cost", AttentionCostOptions, run, ("attention_cost",),
    "seconds and measured peak memory of one attention layer against sequence length: "
    "explicit softmax(QK^T)V, fused SDPA and streaming statistics", check,
    sections=(Section("attention_cost", 20, ("attention_cost",),
                      lambda rep, given: section(rep, given.tables["attention_cost"]),
                      answers=True),),
)  # fmt: skip
