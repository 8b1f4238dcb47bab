"""Bootstrap intervals against an independent resampling computation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from probe.study.verdicts.stats import fmt_ci, mean_ci, over_seeds


def test_interval_matches_a_plain_numpy_percentile_bootstrap():
    rng = np.random.default_rng(1)
    x = rng.normal(0.6, 0.1, size=12)
    mean, low, high = mean_ci(x)
    assert mean == pytest.approx(x.mean())
    resampled = rng.choice(x, size=(20000, x.size), replace=True).mean(axis=1)
    ref_low, ref_high = np.percentile(resampled, [2.5, 97.5])
    assert low == pytest.approx(ref_low, abs=0.01)
    assert high == pytest.approx(ref_high, abs=0.01)
    se = x.std(ddof=0) / np.sqrt(x.size)  # normal approximation: mean +- 1.96 se
    assert low == pytest.approx(x.mean() - 1.96 * se, abs=0.02)


def test_degenerate_cases():
    assert mean_ci([0.5]) == (0.5, *([pytest.approx(np.nan, nan_ok=True)] * 2))
    assert mean_ci([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
    mean, low, high = mean_ci([0.0, 1.0])
    assert mean == 0.5 and 0.0 <= low <= high <= 1.0
    assert fmt_ci(0.5, np.nan, np.nan) == "0.50"
    assert fmt_ci(0.5, 0.25, 0.75) == "0.50 [0.25, 0.75]"


def test_over_seeds_averages_within_a_seed_first():
    df = pd.DataFrame({
        "arm": ["a"] * 6, "seed": [0, 0, 1, 1, 2, 2], "length": [1, 2] * 3,
        "value": [0.0, 1.0, 0.5, 0.5, 1.0, 1.0],
    })  # fmt: skip
    [row] = over_seeds(df, ["arm"]).to_dict("records")
    assert row["mean"] == pytest.approx(np.mean([0.5, 0.5, 1.0]))
    assert row["n_seeds"] == 3 and row["values"] == "0.5;0.5;1"
    assert 0.5 <= row["low"] <= row["high"] <= 1.0
