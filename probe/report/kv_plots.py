"""Figures of a KV-cache study (`probe.kv.summary.by_length` tables in, matplotlib figures out):

- `kv_accuracy_plot`: passkey accuracy against the share of the key/value cache saved, one panel
  per prompt length, a line per head method over its full-head shares (mean over seeds, band:
  the seeds' min to max), streaming at the same memory dashed, the full cache, streaming and
  window-only caches as single points;
- `kv_loss_plot`: the change in next-token loss against the cache saved, on the text rows.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from probe.report.layout import title_above

STYLE = {  # method: (colour, line style, marker); any other method is drawn dotted
    "retrieval": ("tab:red", "-", "o"),
    "razor": ("tab:blue", "-", "s"),
    "duo": ("tab:green", "-", "D"),
    "random": ("0.45", "-", "^"),
    "streaming": ("tab:purple", "--", "v"),
}
POINTS = {"full": ("k", "*", "full cache"), "window": ("tab:orange", "X", "window only, no sink")}


def _lines(ax, part: pd.DataFrame, y: str, band: tuple[str, str] | None) -> None:
    others = sorted(set(part.method) - set(STYLE) - set(POINTS))  # a method without a style
    cycle = [(f"C{i % 10}", ":", "P") for i in range(len(others))]
    for method, (color, style, marker) in [*STYLE.items(), *zip(others, cycle, strict=True)]:
        rows = part[part.method == method]
        if method == "streaming":  # the shares' memory-matched caches, from the plain one at 0
            label = "streaming (same memory)"
        else:
            rows = rows[rows.full_share > 0]
            label = method
        if rows.empty:
            continue
        rows = rows.sort_values("saved")
        x = 100 * rows.saved
        ax.plot(x, rows[y], style, color=color, marker=marker, markersize=4, lw=1.6, label=label)
        if band is not None:
            ax.fill_between(x, rows[band[0]], rows[band[1]], color=color, alpha=0.12, lw=0)
    for method, (color, marker, label) in POINTS.items():
        rows = part[part.method == method]
        if not rows.empty:
            ax.scatter(100 * rows.saved, rows[y], color=color, marker=marker, s=70, zorder=3,
                       label=label)  # fmt: skip


def kv_accuracy_plot(table: pd.DataFrame, metric: str = "needle_accuracy",
                     target: tuple[float, float] | None = None) -> plt.Figure:  # fmt: skip
    """Passkey accuracy against the cache saved, one panel per length; `target` (share saved,
    share of the full cache's accuracy kept) shades the region a plan meets it in."""
    needles = table[table.prompts.notna()]
    lengths = sorted(needles.length.unique())
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.9), sharey=True,
                             squeeze=False)  # fmt: skip
    for ax, length in zip(axes[0], lengths, strict=True):
        part = needles[needles.length == length]
        full = part[part.method == "full"][metric]
        if target is not None and len(full):
            saved, kept = target
            ax.fill_between([100 * saved, 103], kept * float(full.iloc[0]), 1.03, color="gold",
                            alpha=0.15, lw=0, label="target")  # fmt: skip
        _lines(ax, part, metric, ("accuracy_min", "accuracy_max"))
        ax.set_title(f"passkey prompts of {length:,} tokens", fontsize=9)
        ax.set_xlabel("key/value cache saved (%)")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("needle accuracy (share of key tokens)")
    axes[0][-1].legend(frameon=False, fontsize=7, loc="center left")
    fig.tight_layout()
    title_above(fig, "Passkey accuracy against the memory saved (line: mean over seeds; band: "
                "the seeds' range)", fontsize=10)  # fmt: skip
    return fig


def kv_loss_plot(table: pd.DataFrame) -> plt.Figure:
    """The change in loss (nats, against the full cache) against the cache saved."""
    rows = table[table.loss.notna()] if "loss" in table else table.iloc[0:0]
    fig, ax = plt.subplots(figsize=(5.6, 3.9))
    _lines(ax, rows, "loss_change", None)
    length = int(rows.length.iloc[0]) if len(rows) else 0
    ax.set_xlabel("key/value cache saved (%)")
    ax.set_ylabel("loss change against the full cache (nats)")
    ax.set_yscale("symlog", linthresh=0.05)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=7)
    ax.set_title(f"Loss on text rows of {length:,} tokens (mean over seeds)", fontsize=10)
    fig.tight_layout()
    return fig
