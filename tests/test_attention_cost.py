"""Attention cost: the methods against a float64 textbook computation, the measured peak memory
against tensors of known size, and the slope fit against exact power laws."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from probe.analysis.attention_cost import (
    COLUMNS,
    SLOPE_COLUMNS,
    attention_cost,
    fit_slopes,
    measure_peak,
    method_call,
)
from probe.errors import ProbeError
from probe.report.cost_plots import attention_cost_plot

FLOAT = 4


def inputs(n, b=2, h=3, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g) for _ in range(3))  # [b, h, n, d] each


def reference(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) in float64, with its output and the entropy of every row."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [b, h, n, n]
    if causal:
        n = q.shape[2]
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    p = scores.softmax(-1)  # [b, h, n, n]
    entropy = -(p * p.log()).nan_to_num(nan=0.0).sum(-1)  # [b, h, n]; 0 log 0 = 0
    return p @ v, entropy


@pytest.mark.parametrize("causal", [True, False])
def test_methods_agree_with_the_textbook(causal):
    q, k, v = inputs(n=70)
    out, entropy = reference(q, k, v, causal)
    for method in ("explicit", "sdpa"):
        got = method_call(method, q, k, v, causal=causal)()
        torch.testing.assert_close(got.double(), out, atol=1e-5, rtol=1e-5)
    for method in ("streaming_entropy", "explicit_entropy"):
        got = method_call(method, q, k, v, causal=causal, tile=16)()  # 5 tiles, the last short
        torch.testing.assert_close(got.double(), entropy, atol=1e-5, rtol=1e-5)


def test_peak_follows_allocations_and_frees():
    """One tensor of 1000 floats is 4000 bytes; two at once add; one after the other do not."""

    def one_after_the_other():
        a = torch.empty(1000)
        del a
        b = torch.empty(2000)
        del b

    def both_at_once():
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a, b

    assert measure_peak(lambda: torch.empty(1000)) == 4000
    assert measure_peak(one_after_the_other) == 8000
    assert measure_peak(both_at_once) == 12000
    kept = torch.empty(10_000)  # live before the call: not counted, and not freed by it
    assert measure_peak(kept.neg) == 40_000


def test_explicit_memory_is_quadratic_and_streaming_is_not():
    """At N = 256 and 512 (b=1, h=4): explicit holds at least one [b, h, N, N] float32 matrix
    and its peak grows 4x (+-10%) when N doubles; streaming_entropy (tile 64: O(N x tile))
    grows at most 2.5x, and sdpa less than explicit."""
    peaks = {}
    for n in (256, 512):
        q, k, v = inputs(n, b=1, h=4, d=32)
        for method in ("explicit", "sdpa", "streaming_entropy"):
            fn = method_call(method, q, k, v, causal=True, tile=64)
            peaks[method, n] = measure_peak(fn)
    for n in (256, 512):
        assert peaks["explicit", n] >= 1 * 4 * n * n * FLOAT
    growth = {m: peaks[m, 512] / peaks[m, 256] for m in ("explicit", "sdpa", "streaming_entropy")}
    assert 3.6 <= growth["explicit"] <= 4.4, growth
    assert growth["streaming_entropy"] <= 2.5, growth
    assert growth["sdpa"] < growth["explicit"], growth


def test_attention_cost_table_and_skips():
    seen = []
    table = attention_cost(
        [16, 32],
        d_head=8,
        n_head=2,
        methods=("explicit", "streaming_entropy"),
        repeats=2,
        tile=8,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert list(table.columns) == COLUMNS
    assert len(table) == 2 * 2 * 2 and (table["skipped"] == "").all()
    assert list(table["repeat"]) == [0, 1] * 4
    assert (table["seconds"] > 0).all() and (table["peak_bytes"] > 0).all()
    assert seen == [(1, 2), (2, 2)]
    assert set(table.loc[table["method"] == "streaming_entropy", "tile"]) == {8}
    # explicit at n = 32 needs 2 x [1, 2, 32, 32] floats = 16 KiB: over a 12 KiB budget
    small = attention_cost([8, 32], d_head=8, n_head=2, methods=("explicit",), repeats=1,
                           max_bytes=12 * 1024)  # fmt: skip
    skipped = small[small["skipped"] != ""]
    assert list(skipped["n"]) == [32] and skipped["seconds"].isna().all()
    assert (small.loc[small["n"] == 8, "peak_bytes"] > 0).all()


def test_bad_input_says_what_to_do():
    with pytest.raises(ProbeError, match="Did you mean 'sdpa'"):
        attention_cost([16], methods=("spda",))
    with pytest.raises(ProbeError, match="lengths >= 1"):
        attention_cost([0, 16])
    with pytest.raises(ProbeError, match="no column 'flops'"):
        fit_slopes(pd.DataFrame({"method": ["a"], "n": [1], "seconds": [1.0]}), y="flops")


def test_fit_slopes_recovers_exact_power_laws():
    """y = c n^p exactly: slope p to rounding and a zero-width interval; medians over repeats
    (the outlier repeat is ignored); min_n drops the small sizes that follow another law."""
    ns = [64, 128, 256, 512, 1024]
    rows = []
    for n in ns:
        for repeat, noise in enumerate([1.0, 1.0, 50.0]):  # the median is the exact value
            rows.append({"method": "quadratic", "n": n, "repeat": repeat,
                         "seconds": 3e-9 * n**2 * noise})  # fmt: skip
            rows.append({"method": "linear", "n": n, "repeat": repeat,
                         "seconds": 2e-6 * n * noise if n >= 256 else 1.0})  # fmt: skip
    rows.append({"method": "skipped", "n": 64, "repeat": 0, "seconds": np.nan})
    table = pd.DataFrame(rows)
    fits = fit_slopes(table, y="seconds").set_index("method")
    assert list(fits.reset_index().columns) == SLOPE_COLUMNS
    assert fits.loc["quadratic", "slope"] == pytest.approx(2.0, abs=1e-12)
    assert fits.loc["quadratic", "high"] - fits.loc["quadratic", "low"] < 1e-9
    assert fits.loc["quadratic", "intercept"] == pytest.approx(math.log(3e-9), abs=1e-9)
    assert fits.loc["quadratic", "points"] == 5
    linear = fit_slopes(table, y="seconds", min_n=256).set_index("method").loc["linear"]
    assert linear["slope"] == pytest.approx(1.0, abs=1e-12)
    assert (linear["points"], linear["min_n"], linear["max_n"]) == (3, 256, 1024)
    assert np.isnan(fits.loc["skipped", "slope"]) and fits.loc["skipped", "points"] == 0


def test_fit_slopes_interval_covers_a_noisy_slope():
    """The 95% interval is the t interval of the regression: it contains the true slope of
    log-normal noise around n^2 and narrows with the noise."""
    rng = np.random.default_rng(0)
    ns = np.array([2**i for i in range(5, 13)])
    noisy = pd.DataFrame({"method": "m", "n": ns,
                          "seconds": ns**2.0 * np.exp(rng.normal(0, 0.05, len(ns)))})  # fmt: skip
    fit = fit_slopes(noisy).iloc[0]
    assert fit["low"] < 2.0 < fit["high"] and fit["high"] - fit["low"] < 0.2


def test_plot_has_two_log_log_panels():
    table = pd.DataFrame(
        {
            "n": [16, 32, 16, 32, 64],
            "method": ["explicit", "explicit", "sdpa", "sdpa", "sdpa"],
            "seconds": [1e-4, 4e-4, 1e-4, 2e-4, np.nan],
            "peak_bytes": [1024, 4096, 512, 1024, np.nan],
        }
    )
    fig = attention_cost_plot(table)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in axes)
    assert [len(ax.lines) for ax in axes] == [2, 2]
    assert list(axes[1].lines[0].get_ydata()) == [1024 / 2**20, 4096 / 2**20]
