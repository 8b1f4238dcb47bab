"""Plots show what their text says: a pruning curve's band is the 95% t-interval computed here
by hand, clipped to the metric's range, and absent (and not claimed) with one seed; a figure
title never overlaps a panel (bounding boxes after a draw, on grids as tall as SmolLM2's 30
layers); entropy measured at one length is drawn as points, not as a line."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from scipy import stats

from probe.report.attention_plots import entropy_vs_length, head_heatmaps, role_heatmaps
from probe.report.pruning_plots import importance_heatmap, pruning_curve_plot
from probe.report.study_plots import length_curves

RNG = np.random.default_rng(0)


def curve(seeds: int, metric: str, values) -> pd.DataFrame:
    """A pruning curve: methods random and gradient, values[fraction][seed]."""
    rows = [{"fraction": f, "method": m, "seed": s, "metric": metric, "value": v[s]}
            for m in ("gradient", "random") for f, v in zip((0.0, 0.5), values, strict=True)
            for s in range(seeds)]  # fmt: skip
    return pd.DataFrame(rows)


def texts(fig) -> str:
    ax = fig.axes[0]
    legend = ax.get_legend()
    parts = [ax.get_title(), *(t.get_text() for t in legend.get_texts())] if legend else []
    return " | ".join(parts or [ax.get_title()])


def bands(fig) -> list[np.ndarray]:
    """The vertices of every filled band, [n, 2] (x, y)."""
    return [p.vertices for c in fig.axes[0].collections if isinstance(c, PolyCollection)
            for p in c.get_paths()]  # fmt: skip


def test_one_seed_draws_no_band_and_does_not_claim_one():
    fig = pruning_curve_plot(curve(1, "exact_match", [[1.0], [0.6]]))
    assert bands(fig) == []
    assert "95%" not in texts(fig) and "n = 1" in texts(fig)
    plt.close(fig)


def test_a_similarity_band_stays_within_the_cosine_range():
    values = [[1.0, 0.98], [0.97, 0.80]]  # two seeds: t(0.975, 1) = 12.7, far past 1
    fig = pruning_curve_plot(curve(2, "similarity", values), "similarity")
    drawn = bands(fig)
    assert len(drawn) == 2  # one per method
    for vertices in drawn:
        assert vertices[:, 1].max() <= 1.0 + 1e-12 and vertices[:, 1].min() >= -1.0 - 1e-12
    high = max(v[:, 1].max() for v in drawn)
    assert high == pytest.approx(1.0)  # clipped, not dropped
    low = min(v[:, 1].min() for v in drawn)
    x = np.array(values[1])
    by_hand = x.mean() - stats.t.ppf(0.975, 1) * x.std(ddof=1) / math.sqrt(2)
    assert low == pytest.approx(max(by_hand, -1.0))
    assert "clipped to [-1, 1]" in texts(fig)
    plt.close(fig)


def test_an_unclipped_band_is_the_t_interval():
    values = [[0.5, 0.52, 0.55], [0.3, 0.35, 0.33]]
    fig = pruning_curve_plot(curve(3, "exact_match", values))
    x = np.array(values[1])
    half = stats.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
    ys = np.concatenate([v[:, 1] for v in bands(fig)])
    assert np.isclose(ys, x.mean() + half).any() and np.isclose(ys, x.mean() - half).any()
    plt.close(fig)


def roles(n_layer: int, n_head: int) -> pd.DataFrame:
    names = ["previous_token", "induction", "positional", "sink", "retrieval"]
    return pd.DataFrame([
        {"layer": i, "site": f"blocks.{i}.attn", "head": h, "statistic": r, "value": RNG.random(),
         "offset": 1.0 if r == "positional" else np.nan}
        for i in range(n_layer) for h in range(n_head) for r in names
    ])  # fmt: skip


def attention(n_layer: int, n_head: int, lengths) -> pd.DataFrame:
    names = ["entropy", "normalized_entropy", "max_logit", "uniform_entropy"]
    return pd.DataFrame([
        {"layer": i, "site": f"blocks.{i}.attn", "head": h, "length": n, "statistic": s,
         "value": RNG.random()}
        for i in range(n_layer) for h in range(n_head) for n in lengths for s in names
    ])  # fmt: skip


def importance(n_layer: int, n_head: int) -> pd.DataFrame:
    return pd.DataFrame([{"layer": i, "head": h, "method": m, "value": RNG.random()}
                         for m in ("gradient", "ablation") for i in range(n_layer)
                         for h in range(n_head)])  # fmt: skip


def lengths_table() -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "task": t, "seed": s, "length": n, "value": RNG.random(),
                          "L": 8} for a in ("rope", "alibi") for t in ("copy", "sort")
                         for s in range(2) for n in (4, 8, 16)])  # fmt: skip


FIGURES = {
    "roles, 30 x 3": lambda: role_heatmaps(roles(30, 3)),
    "roles, 2 x 4": lambda: role_heatmaps(roles(2, 4)),
    "heatmap, 30 x 3": lambda: head_heatmaps(attention(30, 3, [64, 128]), "normalized_entropy"),
    "entropy, 8 x 3": lambda: entropy_vs_length(attention(8, 3, [64, 128])),
    "entropy, one length": lambda: entropy_vs_length(attention(3, 4, [64])),
    "importance, 30 x 3": lambda: importance_heatmap(importance(30, 3)),
    "length curves": lambda: length_curves(lengths_table(), "exact match", title="a title"),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_the_figure_title_clears_every_panel(name):
    fig = FIGURES[name]()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    assert title.y1 <= fig.bbox.height + 1 and title.y0 >= 0  # inside the figure
    for ax in fig.axes:
        if ax.get_visible():
            panel = ax.get_tightbbox(renderer)
            assert panel.y1 <= title.y0, f"{name}: a panel reaches {panel.y1:.0f} px, the " \
                                         f"title starts at {title.y0:.0f} px"  # fmt: skip
    plt.close(fig)


def test_entropy_at_one_length_is_points_with_a_note():
    fig = entropy_vs_length(attention(3, 4, [64]))
    assert "one length" in fig._suptitle.get_text()
    for ax in fig.axes:
        points = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert sum(len(c.get_offsets()) for c in points) == 4  # one point per head
        drawn = [line for line in ax.get_lines() if len(set(line.get_xdata())) > 1
                 and line.get_linestyle() != "--"]  # fmt: skip
        assert drawn == []  # no line through one x
    plt.close(fig)
