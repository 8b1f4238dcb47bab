"""Figures of a study report: DataFrame in, matplotlib figure out (nothing is computed here that
the table beside the figure does not hold). Lines are means over seeds; bands are seaborn's 95%
bootstrap intervals over the per-seed rows, which stay within the values' range (none is drawn
at a point with one row, and the report's captions say so)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from probe.report.layout import title_above

BAND = {"errorbar": ("ci", 95), "n_boot": 1000, "seed": 0}


def palette(names: list[str]) -> dict[str, tuple]:
    """One fixed colour per name, in the given order (the same arm has one colour everywhere)."""
    colours = sns.color_palette("tab10", max(10, len(names)))
    return {name: colours[i % len(colours)] for i, name in enumerate(names)}


def _facets(n: int, width: float = 4.6, height: float = 3.4, sharey: bool = True):
    cols = min(n, 2 if n <= 4 else 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             sharey=sharey)  # fmt: skip
    axes = axes.ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _legend(fig, axes, title: str) -> None:
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if handles:
        fig.legend(handles, labels, title=title, loc="center left", bbox_to_anchor=(1.0, 0.5),
                   frameon=False)  # fmt: skip


def length_curves(
    df: pd.DataFrame,
    y_label: str,
    *,
    hue: str = "arm",
    facet: str = "task",
    order: list[str] | None = None,
    ylim: tuple[float, float] | None = (-0.02, 1.02),
    title: str = "",
) -> plt.Figure:
    """value against length, one line per `hue`, one panel per `facet`. Needs columns hue,
    facet, seed, length, value, L (and optionally L_min, and variant: rows of a named variant
    are drawn dashed); the dashed vertical line marks L, the longest training length, and the
    grey band the training range."""
    order = order or sorted(df[hue].unique())
    colours = palette(order)
    panels = sorted(df[facet].unique())
    style = {}
    if "variant" in df and (df["variant"] != "").any():  # a study's [[variant]] arms: dashed
        kinds = {False: "from the sweep", True: "a [[variant]]"}
        df = df.assign(**{"arm kind": (df["variant"] != "").map(kinds)})
        style = {"style": "arm kind", "dashes": {kinds[False]: "", kinds[True]: (3, 1.5)}}
    fig, axes = _facets(len(panels))
    for ax, name in zip(axes, panels, strict=True):
        part = df[df[facet] == name]
        sns.lineplot(data=part, x="length", y="value", hue=hue, hue_order=order, palette=colours,
                     marker="o", markersize=3, mew=0, ax=ax, **style, **BAND)  # fmt: skip
        L = int(part["L"].max())
        low = int(part["L_min"].min()) if "L_min" in part else part["length"].min()
        ax.axvspan(low, L, color="0.85", alpha=0.5, lw=0, zorder=0)
        ax.axvline(L, color="black", ls="--", lw=1)
        ax.text(L, 1.01, "L", transform=ax.get_xaxis_transform(), ha="center", va="bottom")
        ax.set_title(str(name), loc="left")
        ax.set_xlabel("task length")
        ax.set_ylabel(y_label)
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    _legend(fig, axes, "" if style else hue)
    fig.tight_layout()
    if title:
        title_above(fig, title)
    return fig


def heatmap(
    df: pd.DataFrame,
    row: str,
    col: str,
    value: str = "mean",
    *,
    title: str = "",
    row_order: list[str] | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> plt.Figure:
    """A `row` x `col` grid of `value`, annotated."""
    grid = df.pivot_table(index=row, columns=col, values=value, aggfunc="mean")
    if row_order is not None:
        grid = grid.reindex([r for r in row_order if r in grid.index])
    fig, ax = plt.subplots(figsize=(1.2 * len(grid.columns) + 2.5, 0.45 * len(grid) + 1.5))
    sns.heatmap(grid, annot=True, fmt=".2f", vmin=vmin, vmax=vmax, cmap="viridis", ax=ax,
                cbar_kws={"shrink": 0.8})  # fmt: skip
    ax.set_xlabel(col)
    ax.set_ylabel(row)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def pruning_curves(df: pd.DataFrame, y_label: str, *, facet: str = "arm") -> plt.Figure:
    """value against the fraction of heads removed, one line per method. Needs columns method,
    fraction (of heads actually removed), seed, value and `facet`."""
    methods = sorted(df["method"].unique())
    panels = sorted(df[facet].unique())
    fig, axes = _facets(len(panels))
    for ax, name in zip(axes, panels, strict=True):
        sns.lineplot(data=df[df[facet] == name], x="fraction", y="value", hue="method",
                     hue_order=methods, marker="o", ax=ax, **BAND)  # fmt: skip
        ax.set_title(str(name))
        ax.set_xlabel("fraction of heads removed")
        ax.set_ylabel(y_label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    _legend(fig, axes, "ranked by")
    fig.tight_layout()
    return fig


def training_curves(
    df: pd.DataFrame, *, hue: str = "arm", facet: str = "task", order: list[str] | None = None
) -> plt.Figure:
    """Training loss against step (log scale). Needs columns hue, facet, seed, step, value."""
    order = order or sorted(df[hue].unique())
    panels = sorted(df[facet].unique())
    fig, axes = _facets(len(panels), height=3.0)
    for ax, name in zip(axes, panels, strict=True):
        sns.lineplot(data=df[df[facet] == name], x="step", y="value", hue=hue, hue_order=order,
                     palette=palette(order), ax=ax, lw=1, **BAND)  # fmt: skip
        ax.set_yscale("log")
        ax.set_title(str(name))
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, axes, hue)
    fig.tight_layout()
    return fig


def attention_training_curves(df: pd.DataFrame, statistics: list[str],
                              order: list[str] | None = None) -> plt.Figure:  # fmt: skip
    """One panel per statistic against training step, a line per arm (mean over seeds, 95%
    band). Needs columns arm, seed, step, metric, value."""
    order = order or sorted(df["arm"].unique())
    fig, axes = _facets(len(statistics), width=3.8, height=3.0, sharey=False)
    for ax, name in zip(axes, statistics, strict=True):
        sns.lineplot(data=df[df["metric"] == name], x="step", y="value", hue="arm",
                     hue_order=order, palette=palette(order), ax=ax, lw=1, **BAND)  # fmt: skip
        ax.set_title(name.replace("_", " "))
        ax.set_xlabel("step")
        ax.set_ylabel("mean over heads")
        ax.grid(alpha=0.3)
    _legend(fig, axes, "arm")
    fig.tight_layout()
    return fig


def depth_curves(df: pd.DataFrame, y_label: str, *, facet: str = "length",
                 order: list[str] | None = None) -> plt.Figure:  # fmt: skip
    """value against the depth of the residual stream (0: the embeddings), one line per arm,
    one panel per `facet` (mean over seeds, 95% band). Needs columns arm, depth, seed, value and
    `facet`."""
    order = order or sorted(df["arm"].unique())
    panels = sorted(df[facet].unique())
    fig, axes = _facets(len(panels), width=4.2, height=3.2)
    for ax, name in zip(axes, panels, strict=True):
        sns.lineplot(data=df[df[facet] == name], x="depth", y="value", hue="arm",
                     hue_order=order, palette=palette(order), marker="o", ax=ax,
                     **BAND)  # fmt: skip
        ax.set_title(f"{facet} {name}", loc="left")
        ax.set_xlabel("depth (0: embeddings, d: after block d)")
        ax.set_ylabel(y_label)
        ax.set_xticks(sorted(df["depth"].unique()))
        ax.grid(alpha=0.3)
    _legend(fig, axes, "arm")
    fig.tight_layout()
    return fig
