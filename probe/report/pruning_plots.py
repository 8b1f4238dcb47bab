"""Figures for head importance and pruning: DataFrames in, matplotlib figures out.

- `importance_heatmap`: layer x head grid of an importance table, one panel per method;
- `correlation_heatmap`: Spearman rho between estimators;
- `pruning_curve_plot`: a metric against the fraction of heads pruned, one line per method with a
  95% confidence band over seeds (Student t, clipped to the metric's range: a cosine similarity
  stays within [-1, 1], an accuracy within [0, 1]), the random baseline dashed; a method with one
  seed has no band, and the title says which are drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

from probe.errors import ProbeError
from probe.pruning.choices import estimator
from probe.report.layout import title_above

METRIC_LABELS = {
    "exact_match": "exact match",
    "token_accuracy": "token accuracy",
    "loss": "loss (cross-entropy, nats)",
}
# the values each metric can take: a band never claims more than the metric allows
METRIC_RANGES = {
    "exact_match": (0.0, 1.0),
    "token_accuracy": (0.0, 1.0),
    "similarity": (-1.0, 1.0),  # cosine
    "neighbours": (0.0, 1.0),  # a share of rows
    "loss": (0.0, math.inf),
    "perplexity": (1.0, math.inf),
}
DEFAULT_RANGE = (0.0, math.inf)  # every other metric probe writes is a share, count or loss


def _need(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ProbeError(f"The {what} table lacks columns {missing}; expected {list(columns)}.")
    if df.empty:
        raise ProbeError(f"The {what} table is empty; there is nothing to plot.")


def importance_heatmap(
    table: pd.DataFrame, sites: Sequence[str] | None = None, n_head: int | None = None
) -> plt.Figure:
    """One layer x head panel per method; pruned (absent) heads are left blank.

    sites: names for the layer axis (e.g. `[s.name for s in cfg.sites()]`); n_head: head columns
    (default: the largest head id + 1).
    """
    _need(table, ["layer", "head", "method", "value"], "importance")
    methods = list(dict.fromkeys(table["method"]))
    n_layer = int(table["layer"].max()) + 1 if sites is None else len(sites)
    n_head = n_head or int(table["head"].max()) + 1
    width, height = max(3.6, 0.75 * n_head + 2.2), 0.5 * n_layer + 1.5
    n_cols = min(3, len(methods))
    n_rows = math.ceil(len(methods) / n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(width * n_cols, height * n_rows + 0.4), squeeze=False
    )
    for ax in axes.flat[len(methods) :]:
        ax.set_visible(False)
    for k, (ax, method) in enumerate(zip(axes.flat, methods, strict=False)):
        part = table[table["method"] == method]
        grid = np.full((n_layer, n_head), np.nan)
        grid[part["layer"].to_numpy(int), part["head"].to_numpy(int)] = part["value"].to_numpy()
        declared = estimator(method)
        low = declared is not None and declared.low_is_important  # dark = important
        cmap = plt.get_cmap("viridis_r" if low else "viridis")
        cmap = cmap.with_extremes(bad="#eeeeee")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto")
        finite = grid[np.isfinite(grid)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
        if n_layer * n_head <= 256:
            for (i, j), v in np.ndenumerate(grid):
                text = "" if np.isnan(v) else f"{v:.3g}"
                dark = not np.isnan(v) and ((v > mid) == low)
                color = "white" if dark else "black"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
        ax.set_xticks(range(n_head))
        ax.set_yticks(range(n_layer))
        ax.set_yticklabels(list(sites) if sites is not None else [str(i) for i in range(n_layer)])
        ax.set_xlabel("head (original id)")
        if k % n_cols == 0:
            ax.set_ylabel("attention site" if sites is not None else "layer")
        ax.set_title(declared.label if declared is not None else method, fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    title_above(fig, "Head importance (brighter = more important; grey = pruned)", fontsize=11)
    return fig


def correlation_heatmap(correlations: pd.DataFrame) -> plt.Figure:
    """Spearman rho between estimators (entropy counted as importance, i.e. negated)."""
    _need(correlations, ["method", "other", "rho"], "correlation")
    wide = correlations.pivot(index="method", columns="other", values="rho")
    order = list(dict.fromkeys(correlations["method"]))
    wide = wide.loc[order, order]
    n = len(order)
    fig, ax = plt.subplots(figsize=(1.1 * n + 2.2, 0.9 * n + 1.4))
    image = ax.imshow(wide.to_numpy(float), cmap="RdBu_r", vmin=-1, vmax=1)
    for (i, j), v in np.ndenumerate(wide.to_numpy(float)):
        color = "white" if abs(v) > 0.6 else "black"
        text = "n/a" if np.isnan(v) else f"{v:.2f}"
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(n), order, rotation=30, ha="right")
    ax.set_yticks(range(n), order)
    ax.set_title("Agreement between importance estimators (Spearman ρ)", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def _band(values: pd.Series, bounds: tuple[float, float] = (-math.inf, math.inf)):
    """Mean and 95% Student-t interval over seeds, clipped to `bounds` (the metric's range);
    no band (low = high = mean) for a single seed."""
    mean = float(values.mean())
    n = len(values)
    if n < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.975, n - 1)) * float(values.std(ddof=1)) / math.sqrt(n)
    lo, hi = bounds
    return mean, max(mean - half, lo), min(mean + half, hi)


def _band_note(seeds: dict[str, int], bounds: tuple[float, float]) -> str:
    """What the lines and bands of a pruning curve are, as drawn: no band where n = 1."""
    if max(seeds.values()) < 2:
        return "line: one seed; no band (n = 1)"
    lo, hi = bounds
    where = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
    note = f"line: mean over seeds; band: 95% t-interval, clipped to {where}"
    single = [m for m, n in seeds.items() if n < 2]
    if single:
        note += f"; no band for {', '.join(single)} (n = 1)"
    return note


def pruning_curve_plot(
    curve: pd.DataFrame,
    metric: str = "exact_match",
    title: str | None = None,
    threshold: float | None = None,
) -> plt.Figure:
    """`metric` against the fraction of heads pruned: a line per method (mean over seeds) with a
    95% confidence band; the random baseline dashed grey; `threshold` a dotted line (the
    tolerance an operating point is read at)."""
    _need(curve, ["fraction", "method", "seed", "metric", "value"], "pruning curve")
    part = curve[curve["metric"] == metric]
    if part.empty:
        have = ", ".join(sorted(curve["metric"].unique()))
        raise ProbeError(f"No metric '{metric}' in the pruning curve; it has: {have}.")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = iter(plt.get_cmap("tab10").colors)
    markers = iter("osD^vP*X")
    bounds = METRIC_RANGES.get(metric, DEFAULT_RANGE)
    bounded = metric in ("exact_match", "token_accuracy")
    methods = sorted(part["method"].unique(), key=lambda m: (m == "random", m))
    seeds = {}
    for k, method in enumerate(methods):
        rows = part[part["method"] == method]
        summary = [(f, *_band(g["value"], bounds)) for f, g in rows.groupby("fraction")]
        x, mean, low, high = (np.array(v) for v in zip(*summary, strict=True))
        n_seeds = seeds[method] = rows["seed"].nunique()
        if method == "random":
            color, style, width = "0.4", "--", 1.5
        else:  # earlier lines wider, so that methods ranking heads alike stay visible
            color, style, width = next(colors), "-", max(1.2, 3.5 - 0.9 * k)
        label = f"{method} ({n_seeds} seed{'s' if n_seeds != 1 else ''})"
        ax.plot(
            x, mean, style, marker=next(markers), markersize=4, linewidth=width, color=color,
            label=label, alpha=0.9,
        )  # fmt: skip
        if n_seeds > 1:
            ax.fill_between(x, low, high, color=color, alpha=0.15, linewidth=0)
    if threshold is not None:
        ax.axhline(threshold, ls=":", color="k", lw=1, label=f"tolerance ({threshold:.3g})")
    ax.set_xlabel("fraction of heads pruned")
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    ax.set_xlim(-0.02, min(1.0, float(part["fraction"].max())) + 0.02)
    if bounded:
        ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8, title="importance estimator", title_fontsize=8)
    ax.set_title(f"{title or 'Pruning curve'}\n({_band_note(seeds, bounds)})", fontsize=10)
    fig.tight_layout()
    return fig


def knockout_plot(knockout: pd.DataFrame, metric: str = "copy_accuracy") -> plt.Figure:
    """`metric` (copy_accuracy, teacher-forced, or recall, the greedy output's needle recall)
    with the top-k retrieval heads masked (red) against k random heads (grey dots, one per draw),
    for each k; the unmasked model dashed."""
    _need(knockout, ["k", "selection", metric], "knock-out")
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    ks = sorted(k for k in knockout.k.unique() if k > 0)
    gen = np.random.default_rng(0)  # horizontal jitter only
    for i, k in enumerate(ks):
        rand = knockout[(knockout.k == k) & (knockout.selection == "random")][metric]
        ax.scatter(i + gen.uniform(-0.12, 0.12, len(rand)), rand, s=14, color="0.5",
                   label="random heads" if i == 0 else None)  # fmt: skip
        top = knockout[(knockout.k == k) & (knockout.selection == "retrieval")][metric]
        ax.scatter([i] * len(top), top, s=70, marker="D", color="tab:red",
                   label="top retrieval heads" if i == 0 else None, zorder=3)  # fmt: skip
    base = knockout[knockout.selection == "none"][metric]
    if len(base):
        ax.axhline(float(base.iloc[0]), ls="--", color="k", lw=1, label="no head masked")
    ax.set_xticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("heads masked (k)")
    ax.set_ylabel(
        {"recall": "needle recall of the greedy output"}.get(
            metric, "copy accuracy on needle prompts (teacher-forced)"
        )
    )
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    ax.set_title("Masking retrieval heads against random heads", fontsize=10)
    fig.tight_layout()
    return fig


def speed_plot(timing: pd.DataFrame) -> plt.Figure:
    """Tokens per second of each pruned model over the original's, measured side by side, one
    group of bars per batch size."""
    _need(timing, ["variant", "batch_size", "method", "n_pruned", "tokens_per_s"], "timing")
    pivot = timing.pivot_table(index=["method", "unit", "n_pruned", "batch_size"],
                               columns="variant", values="tokens_per_s")  # fmt: skip
    ratio = (pivot["pruned"] / pivot["original"]).rename("ratio").reset_index()
    sizes = sorted(ratio.batch_size.unique())
    labels = [
        f"{m} ({u}) −{n}"
        for m, u, n in ratio[["method", "unit", "n_pruned"]]
        .drop_duplicates()
        .itertuples(index=False)
    ]
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(labels) * len(sizes) + 1.6))
    width = 0.8 / len(sizes)
    for j, size in enumerate(sizes):
        part = ratio[ratio.batch_size == size]
        ax.barh(np.arange(len(part)) + j * width, part.ratio, height=width,
                label=f"batch {size}")  # fmt: skip
    ax.set_yticks(np.arange(len(labels)) + width * (len(sizes) - 1) / 2, labels, fontsize=8)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel("tokens/s of the pruned model ÷ the original's (one thread)")
    ax.invert_yaxis()
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Measured speed of the physically pruned models (−n: heads removed)", fontsize=10)
    fig.tight_layout()
    return fig
