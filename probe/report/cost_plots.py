"""Figures of attention cost against sequence length: DataFrame in, matplotlib figure out (the
table of `probe.analysis.attention_cost.attention_cost` alone rebuilds them)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from probe.report.study_plots import palette

PANELS = {  # column -> (axis label, divisor)
    "seconds": ("seconds per call (median)", 1.0),
    "peak_bytes": ("peak extra memory, MiB (median)", 2.0**20),
}


def attention_cost_plot(table: pd.DataFrame) -> plt.Figure:
    """Two log-log panels against n: median seconds and median peak bytes (in MiB), one line per
    method, with a band from the smallest to the largest repeat. Needs columns n, method,
    seconds, peak_bytes; rows without a measurement (skipped sizes) are left out."""
    order = list(dict.fromkeys(table["method"]))
    colours = palette(order)
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for ax, (column, (label, divisor)) in zip(axes, PANELS.items(), strict=True):
        for method in order:
            part = table[table["method"] == method].dropna(subset=[column])
            part = part[part[column] > 0]
            if part.empty:
                continue
            spread = part.groupby("n")[column].agg(["median", "min", "max"]) / divisor
            ax.plot(spread.index, spread["median"], marker="o", markersize=3, lw=1.2,
                    color=colours[method], label=method)  # fmt: skip
            ax.fill_between(spread.index, spread["min"], spread["max"], color=colours[method],
                            alpha=0.2, lw=0)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, title="method", loc="center left",
                   bbox_to_anchor=(1.0, 0.5), frameon=False)  # fmt: skip
    fig.tight_layout()
    return fig
