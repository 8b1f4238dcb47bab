"""Figures of the attention observatory: DataFrames in, matplotlib figures out.

Every figure is rebuilt from a saved table alone (attention_stats.csv, roles.csv, scaling.csv,
scaling_training.csv); `write_inspection` and `write_scaling` save the tables and the figures.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probe.files import atomic_write_bytes
from probe.report.files import atomic_save_figure, atomic_write_csv, atomic_write_json
from probe.report.layout import title_above
from probe.schema import normalise

ROLE_TITLES = {
    "previous_token": "previous token: p(i -> i-1)",
    "induction": "induction (repeated random tokens)",
    "positional": "fixed offset: best mean p(i -> i+o)",
    "sink": "sink: p(-> position 0)",
    "retrieval": "retrieval: share of the needle's tokens it retrieves (greedy)",
}
SCALE_LABELS = {"sqrt": "1/sqrt(d_k)", "none": "1 (unscaled)", "inverse": "1/d_k"}
SCALE_ORDER = ["sqrt", "none", "inverse"]


def _site_labels(table: pd.DataFrame) -> dict[int, str]:
    sites = table.drop_duplicates("layer").set_index("layer")["site"]
    return {layer: f"{layer}: {site}" for layer, site in sites.items()}


def _pick(values: list, most: int) -> list:
    """At most `most` values, evenly spread and always keeping the first and the last."""
    if len(values) <= most:
        return values
    index = np.unique(np.linspace(0, len(values) - 1, most).round().astype(int))
    return [values[i] for i in index]


def head_heatmaps(stats: pd.DataFrame, statistic: str, max_panels: int = 4) -> plt.Figure:
    """Layer x head heatmaps of one statistic, one panel per task length."""
    data = stats[stats.statistic == statistic]
    if data.empty:
        raise ValueError(f"no rows for statistic {statistic!r}")
    lengths = _pick(sorted(data.length.unique()), max_panels)
    labels = _site_labels(data)
    n_layer, n_head = data.layer.nunique(), data["head"].nunique()
    size = (0.75 * n_head * len(lengths) + 3.0, 0.55 * n_layer + 1.6)
    fig, axes = plt.subplots(1, len(lengths), figsize=size, squeeze=False, sharey=True)
    bounded = statistic in ("normalized_entropy", "p_max", "sink_mass") or "gt_" in statistic
    vmin, vmax = (0.0, 1.0) if bounded else (data.value.min(), data.value.max())
    for ax, n in zip(axes[0], lengths, strict=True):
        grid = data[data.length == n].pivot_table(index="layer", columns="head", values="value")
        grid.index = [labels[i] for i in grid.index]
        sns.heatmap(
            grid,
            ax=ax,
            annot=True,
            fmt=".2f",
            cmap="viridis",
            vmin=vmin,
            vmax=vmax,
            cbar=ax is axes[0][-1],
            annot_kws={"size": 8},
            linewidths=0.5,
        )
        ax.set_title(f"length {n}", fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("")
        ax.tick_params(axis="y", rotation=0)
    agg = "maximum" if statistic in ("max_logit", "raw_logit_max") else "mean"
    fig.tight_layout()
    title_above(fig, f"{statistic.replace('_', ' ')} per head ({agg} over query rows and examples)")
    return fig


def entropy_vs_length(stats: pd.DataFrame, statistic: str = "entropy") -> plt.Figure:
    """One panel per attention site: the statistic against task length, one line per head, and
    (for entropy) the entropy of a head spread evenly over what it sees, dashed. Measured at one
    length there is no trend to draw: each head is a point at that length, and the title says
    so."""
    data = stats[stats.statistic == statistic].copy()
    labels = _site_labels(data)
    data["where"] = data.layer.map(labels)
    data["head"] = data["head"].astype(str)
    wrap = min(4, data.layer.nunique())
    lengths = sorted(data.length.unique())
    one = len(lengths) == 1
    grid = sns.relplot(
        data=data,
        x="head" if one else "length",
        y="value",
        hue="head",
        col="where",
        col_wrap=wrap,
        kind="scatter" if one else "line",
        marker="o",
        height=2.8,
        aspect=1.15,
        facet_kws={"sharey": True},
        legend=not one,
    )
    uniform = stats[stats.statistic == "uniform_entropy"]
    for layer, ax in zip(sorted(labels), grid.axes.flat, strict=False):
        ref = uniform[uniform.layer == layer].groupby("length").value.mean()
        if statistic == "entropy" and not ref.empty:
            if one:
                ax.axhline(float(ref.iloc[0]), ls="--", color="0.4", lw=1, label="uniform")
            else:
                ax.plot(ref.index, ref.to_numpy(), ls="--", color="0.4", lw=1, label="uniform")
        if not one:
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
    grid.set_titles("{col_name}")
    name = statistic.replace("_", " ")
    grid.set_axis_labels("head" if one else "task length", f"{name} (nats)")
    note = " (dashed: spread evenly over the visible keys)" if not uniform.empty else ""
    if one:
        title = f"{name} per head at length {lengths[0]}, the one length measured{note}"
    else:
        title = f"{name} against length, per head{note}"
    title_above(grid.figure, title)
    return grid.figure


def role_heatmaps(roles: pd.DataFrame) -> plt.Figure:
    """One layer x head heatmap per role; the positional panel shows the best offset too."""
    roles = normalise("roles", roles)  # a roles.csv saved before the one schema too
    present = [r for r in ROLE_TITLES if r in set(roles.statistic)]
    labels = _site_labels(roles)
    n_layer, n_head = roles.layer.nunique(), roles["head"].nunique()
    n_cols = 2 if len(present) > 2 else len(present)
    n_rows = -(-len(present) // n_cols)
    size = (0.8 * n_head * n_cols + 4.0, (0.5 * n_layer + 1.3) * n_rows + 0.6)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=size, squeeze=False)
    for ax, role in zip(axes.flat, present, strict=False):
        part = roles[roles.statistic == role]
        grid = part.pivot_table(index="layer", columns="head", values="value", dropna=False)
        annot = grid.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
        if role == "positional":
            offsets = part.pivot_table(index="layer", columns="head", values="offset")
            annot = annot + offsets.reindex_like(grid).map(
                lambda o: "" if pd.isna(o) else f" ({int(o):+d})"
            )
        grid.index = [labels[i] for i in grid.index]
        sns.heatmap(
            grid,
            ax=ax,
            annot=annot.to_numpy(),
            fmt="",
            cmap="mako",
            vmin=0,
            vmax=1,
            cbar=True,
            annot_kws={"size": 7},
            linewidths=0.5,
        )
        ax.set_title(ROLE_TITLES[role], fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("")
        ax.tick_params(axis="y", rotation=0)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    what = "mean attention probability" + ("; retrieval: share of needle tokens" if
                                            "retrieval" in present else "")  # fmt: skip
    fig.tight_layout()
    title_above(fig, f"head roles: {what} (blank: not defined; (o): best offset)")
    return fig


def _scale_palette(scales) -> dict[str, tuple]:
    colors = sns.color_palette("colorblind", 3)
    return {s: colors[SCALE_ORDER.index(s) % 3] if s in SCALE_ORDER else "gray" for s in scales}


def scaling_init_figure(init: pd.DataFrame) -> plt.Figure:
    """Part 1: score variance, normalized entropy, near-one-hot rows and the softmax Jacobian
    against d_k, per scale (colour) and number of keys n (marker)."""
    data = init.copy()
    palette = _scale_palette(data.scale.unique())
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [
        ("score_var", "variance of scores", "log"),
        ("normalized_entropy", "entropy / log n", "linear"),
        ("p_max_gt_0.9", "fraction of rows with p_max > 0.9", "linear"),
        ("softmax_jacobian_norm", "mean ||softmax Jacobian||_F (uniform row: ~1/sqrt(n))", "log"),
    ]
    for ax, (stat, title, yscale) in zip(axes.flat, panels, strict=True):
        part = data[data.statistic == stat]
        sns.lineplot(
            data=part,
            x="d_k",
            y="value",
            hue="scale",
            style="n",
            markers=True,
            dashes=False,
            palette=palette,
            ax=ax,
            legend=ax is axes.flat[0],
        )
        if stat == "score_var":
            predicted = data[data.statistic == "score_var_predicted"].drop_duplicates(
                ["d_k", "scale"]
            )
            for scale, line in predicted.groupby("scale"):
                ax.plot(line.d_k, line.value, ls="--", lw=1, color=palette[scale])
            ax.text(
                0.02,
                0.97,
                "dashed: predicted d_k x factor^2",
                transform=ax.transAxes,
                va="top",
                fontsize=8,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale(yscale)
        ax.set_title(title)
        ax.set_xlabel("d_k")
        ax.set_ylabel("")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[0].get_legend().remove()
    labels = [SCALE_LABELS.get(x, x if x != "n" else "keys n") for x in labels]
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    title_above(fig, "q, k ~ N(0, I) at initialization: why scores are divided by sqrt(d_k)")
    return fig


def scaling_training_figure(curves: pd.DataFrame) -> plt.Figure:
    """Part 2: loss, normalized entropy and max logit during training, per scale (heads and
    layers pooled: line = mean, band = range)."""
    palette = _scale_palette(curves.scale.unique())
    d_k = int(curves.d_k.iloc[0])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        ("loss", "training loss"),
        ("normalized_entropy", "entropy / log n_visible"),
        ("max_logit", "max attention logit"),
    ]
    for ax, (stat, title) in zip(axes, panels, strict=True):
        part = curves[curves.statistic == stat]
        if part.empty:
            ax.set_visible(False)
            continue
        for scale, line in part.groupby("scale", sort=False):
            agg = line.groupby("step").value.agg(["mean", "min", "max"])
            label = SCALE_LABELS.get(scale, scale)
            if stat == "loss":  # one batch of one random length per point: smooth it
                ax.plot(agg.index, agg["mean"], color=palette[scale], alpha=0.2, lw=0.8)
                smooth = agg["mean"].rolling(max(1, len(agg) // 15), min_periods=1).mean()
                ax.plot(agg.index, smooth, color=palette[scale], label=label)
            else:
                ax.plot(agg.index, agg["mean"], color=palette[scale], label=label)
                ax.fill_between(agg.index, agg["min"], agg["max"], color=palette[scale], alpha=0.15)
        ax.set_title(title)
        ax.set_xlabel("step")
        if stat == "max_logit":
            ax.set_yscale("symlog", linthresh=1.0)
    axes[0].legend(title="scale")
    title = f"models identical but for the scale (d_k = {d_k}); band: range over heads"
    final = curves[curves.statistic == "exact_match"]
    if not final.empty:
        text = ", ".join(
            f"{SCALE_LABELS.get(s, s)} {v:.2f}"
            for s, v in final.groupby("scale", sort=False).value.last().items()
        )
        title += f"\nfinal exact match at the training lengths: {text}"
    fig.tight_layout()
    title_above(fig, title)
    return fig


def _save(fig: plt.Figure, path: Path) -> Path:
    atomic_save_figure(path, fig)
    plt.close(fig)
    return path


def _table(frame: pd.DataFrame, path: Path) -> list[Path]:
    """The table as CSV and parquet, each written atomically."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write_bytes(path.with_suffix(".parquet"), buffer.getvalue())
    return [atomic_write_csv(path.with_suffix(".csv"), frame), path.with_suffix(".parquet")]


def write_inspection(
    stats: pd.DataFrame, roles: pd.DataFrame, out: Path, manifest: dict
) -> list[Path]:
    """attention_stats.{csv,parquet}, roles.{csv,parquet}, manifest.json and the figures."""
    out = Path(out)
    written = _table(stats, out / "attention_stats") + _table(roles, out / "roles")
    written.append(atomic_write_json(out / "manifest.json", manifest))
    for statistic in ("normalized_entropy", "max_logit"):
        written.append(_save(head_heatmaps(stats, statistic), out / f"heatmap_{statistic}.png"))
    written.append(_save(entropy_vs_length(stats), out / "entropy_vs_length.png"))
    written.append(_save(role_heatmaps(roles), out / "roles.png"))
    return written


def write_scaling(
    init: pd.DataFrame, curves: pd.DataFrame | None, out: Path, manifest: dict
) -> list[Path]:
    """scaling.csv, scaling_training.csv (when trained), manifest.json and the figures."""
    out = Path(out)
    written = [
        atomic_write_csv(out / "scaling.csv", init),
        atomic_write_json(out / "manifest.json", manifest),
        _save(scaling_init_figure(init), out / "scaling_init.png"),
    ]
    if curves is not None and not curves.empty:
        written.append(atomic_write_csv(out / "scaling_training.csv", curves))
        written.append(_save(scaling_training_figure(curves), out / "scaling_training.png"))
    return written
