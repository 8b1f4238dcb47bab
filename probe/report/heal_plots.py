"""Figures of healing by distillation (`probe heal`'s heal.csv and losses.csv in, figures out):

- `heal_plot`: one run: held-out perplexity against training tokens (the original and the
  pruned model as horizontal lines), and the distillation loss of every step;
- `heal_curves_plot`: a study's runs: perplexity against tokens, a line per pruning method
  (mean over seeds, band: the seeds' min to max), the original model's level dashed.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from probe.report.layout import title_above

COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "0.4")


def _token_axis(ax, tokens) -> None:
    """A symmetric-log axis of token counts, ticked at the counts measured (0 included)."""
    ticks = sorted({int(t) for t in tokens})
    positive = [t for t in ticks if t > 0]
    ax.set_xscale("symlog", linthresh=positive[0] if positive else 1)
    ax.set_xticks(ticks, [f"{t // 1024}Ki" if t and t % 1024 == 0 else f"{t:,}" for t in ticks])
    ax.minorticks_off()


def _level(table: pd.DataFrame, stage: str) -> float:
    rows = table[(table.stage == stage) & (table.metric == "perplexity")]
    return float(rows.value.mean())


def heal_plot(table: pd.DataFrame, losses: pd.DataFrame) -> plt.Figure:
    """heal.csv (stage, tokens, metric, value) and losses.csv (step, tokens, kl, ...)."""
    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.9))
    healed = table[(table.stage == "healed") & (table.metric == "perplexity")]
    pruned = _level(table, "pruned")
    ax.plot([0, *healed.tokens], [pruned, *healed.value], "o-", color="tab:blue",
            label="healed student")  # fmt: skip
    ax.axhline(_level(table, "original"), color="k", ls="--", lw=1, label="original (teacher)")
    ax.axhline(pruned, color="tab:red", ls=":", lw=1, label="pruned, before healing")
    _token_axis(ax, [0, *healed.tokens])
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out perplexity")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    ax.set_title("Held-out perplexity", fontsize=10)
    if len(losses):
        ax_loss.plot(losses.tokens, losses.kl, color="tab:blue", lw=1)
    ax_loss.set_xlabel("training tokens")
    ax_loss.set_ylabel("KL(teacher || student) per token (nats)")
    ax_loss.set_yscale("log")
    ax_loss.grid(alpha=0.3)
    ax_loss.set_title("Distillation loss of each step", fontsize=10)
    fig.tight_layout()
    title_above(fig, "Healing a pruned model by distillation")
    return fig


def heal_curves_plot(table: pd.DataFrame) -> plt.Figure:
    """A study's heal.csv (method, seed, stage, tokens, metric, value): perplexity against
    tokens per method, tokens 0 being the pruned model, with the seeds' range as a band."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ppl = table[table.metric == "perplexity"]
    for color, (method, rows) in zip(COLORS, ppl[ppl.stage != "original"].groupby(
            "method", sort=False), strict=False):  # fmt: skip
        stats = rows.groupby("tokens").value.agg(["mean", "min", "max"]).reset_index()
        ax.plot(stats.tokens, stats["mean"], "o-", color=color, label=method)
        ax.fill_between(stats.tokens, stats["min"], stats["max"], color=color, alpha=0.2, lw=0)
    original = ppl[ppl.stage == "original"].value
    if len(original):
        ax.axhline(float(original.mean()), color="k", ls="--", lw=1, label="original")
    _token_axis(ax, ppl.tokens)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("distillation tokens (0: pruned, before healing)")
    ax.set_ylabel("held-out perplexity")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    title_above(fig, "Healing pruned models: perplexity against tokens (band: seeds' range)")
    return fig
