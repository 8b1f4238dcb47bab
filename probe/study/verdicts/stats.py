"""Means over seeds with 95% bootstrap confidence intervals (scipy.stats.bootstrap), and the
exact Mann-Whitney test the verdicts use (`mann_whitney`)."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.stats import PermutationMethod, bootstrap, mannwhitneyu, rankdata

CONFIDENCE = 0.95
MOST_SPLITS = 200_000  # splits the exact test enumerates itself (20 seeds: 10 against 10)
N_RESAMPLES = 2000


def mean_ci(values, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the percentile bootstrap CI of the mean. With fewer than two values,
    or identical values, the interval collapses to the mean (low = high = mean) or is NaN for
    a single value, which the report states as 'one seed, no interval'."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return (np.nan, np.nan, np.nan)
    mean = float(x.mean())
    if x.size < 2:
        return (mean, np.nan, np.nan)
    if np.ptp(x) == 0:
        return (mean, mean, mean)
    options = {"confidence_level": CONFIDENCE, "n_resamples": N_RESAMPLES, "method": "percentile"}
    try:
        result = bootstrap((x,), np.mean, rng=np.random.default_rng(seed), **options)
    except TypeError:  # scipy < 1.15 calls the generator random_state
        result = bootstrap((x,), np.mean, random_state=np.random.default_rng(seed), **options)
    return (mean, float(result.confidence_interval.low), float(result.confidence_interval.high))


def over_seeds(df: pd.DataFrame, by: list[str], value: str = "value") -> pd.DataFrame:
    """Average `value` within each (by, seed), then the mean and CI over seeds per `by` group.

    Columns: by..., mean, low, high, n_seeds, values (the per-seed means, ';'-joined in seed
    order, so a reader can check the interval)."""
    per_seed = df.groupby([*by, "seed"], sort=True, dropna=False)[value].mean().reset_index()
    rows = []
    for keys, group in per_seed.groupby(by, sort=True, dropna=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        mean, low, high = mean_ci(group[value].to_numpy())
        seeds = ";".join(f"{v:.4g}" for v in group[value])
        rows.append({**dict(zip(by, keys, strict=True)), "mean": mean, "low": low, "high": high,
                     "n_seeds": len(group), "values": seeds})  # fmt: skip
    return pd.DataFrame(rows, columns=[*by, "mean", "low", "high", "n_seeds", "values"])


def row_ci(row, threshold: float | None = None) -> str:
    """`fmt_ci` of a row of `over_seeds` (its mean, low and high)."""
    return fmt_ci(row["mean"], row["low"], row["high"], threshold=threshold)


def _side(value: float, threshold: float) -> int:
    return int(value > threshold) - int(value < threshold)


def fmt_vs(value: float, threshold: float, digits: int = 2, style: str = "f") -> str:
    """`value` with at least `digits` digits (style "f": decimals, "g": significant), and as many
    more as it takes for the printed number to lie on the same side of `threshold` as the value
    itself: 0.9468 against 0.95 prints "0.947", never "0.95"; 0.05004 against 0.05 (style "g",
    3 digits) prints "0.05004"."""
    if not np.isfinite(value):
        return f"{value}"
    side = _side(value, threshold)
    for d in range(digits, 18):
        text = f"{value:.{d}{style}}"
        if _side(float(text), threshold) == side:
            return text
    return repr(float(value))


def fmt_ci(mean: float, low: float, high: float, digits: int = 2,
           threshold: float | None = None) -> str:  # fmt: skip
    """'0.82 [0.75, 0.90]', or '0.82' when there is no interval. With a `threshold` the mean is
    tested against, the mean gets the digits `fmt_vs` needs (and the interval as many)."""
    if np.isnan(mean):
        return "–"
    if threshold is not None:
        text = fmt_vs(mean, threshold, digits)
        digits = len(text.split(".")[1]) if "." in text else 0
    else:
        text = f"{mean:.{digits}f}"
    if np.isnan(low) or np.isnan(high):
        return text
    return f"{text} [{low:.{digits}f}, {high:.{digits}f}]"


def seed_counts(df: pd.DataFrame, by: list[str], rows: bool = False) -> list[int]:
    """The number of seeds behind each group of `by` (a table's cell); with `rows`, the number
    of rows (a plotted point: what seaborn's bootstrap resamples, one per cell)."""
    if not len(df):
        return []
    groups = df.groupby(by, dropna=False)
    return (groups.size() if rows else groups["seed"].nunique()).tolist()


def _spread(counts) -> str:
    """'many' when every group has two or more seeds (or there are none), 'one' when every
    group has one, 'some' in between: what an interval over seeds can be drawn for."""
    counts = [int(n) for n in counts]
    if not counts or min(counts) >= 2:
        return "many"
    return "one" if max(counts) < 2 else "some"


def interval_words(counts) -> str:
    """What a 'mean [low, high]' entry is, for groups of `counts` seeds (lower case)."""
    return {
        "many": "mean over seeds [95% bootstrap interval]",
        "one": "one seed, so no interval",
        "some": "mean over seeds [95% bootstrap interval where there are two or more seeds]",
    }[_spread(counts)]


def band_words(counts, short: bool = False) -> str:
    """What the lines and bands of a seaborn plot over seeds are, for points of `counts` seeds
    (seaborn draws no band at a point with one seed); `short` for a figure's caption."""
    spread = _spread(counts)
    if short:
        return {
            "many": "mean over seeds, 95% band",
            "one": "one seed: no band",
            "some": "mean over seeds, 95% band where there are two or more seeds",
        }[spread]
    return {
        "many": "Lines are means over seeds, bands 95% bootstrap intervals",
        "one": "Lines are single runs (one seed: no band)",
        "some": "Lines are means over seeds, bands 95% bootstrap intervals (no band where a "
        "point has one seed)",
    }[spread]  # fmt: skip


def mann_whitney(x, y, alternative: str) -> float:
    """The exact Mann-Whitney p-value of `x` against `y` ("greater": x tends to be larger), ties
    included: U (mid-ranks) against its distribution over every one of the C(n + m, n) ways to
    split the pooled values, as a permutation test counts them (two-sided: twice the smaller
    tail, at most 1, as the untied exact test has it). scipy's method="exact" uses the table of
    untied values, which is wrong under ties (two identical all-zero arms of 3 seeds: 0.65 where
    every split gives the same U, p = 1)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n, m = len(x), len(y)
    if math.comb(n + m, n) > MOST_SPLITS:  # many seeds: scipy's permutation test, every split
        method = PermutationMethod(n_resamples=np.inf)
        return float(mannwhitneyu(x, y, alternative=alternative, method=method).pvalue)
    ranks = rankdata(np.concatenate([x, y]))  # mid-ranks
    splits = np.array(list(combinations(range(n + m), n)), dtype=int).reshape(-1, n)
    u = ranks[splits].sum(axis=1)  # each split's rank sum of the first sample
    observed = ranks[:n].sum()
    tol = 1e-9 * max(1.0, float(ranks.sum()))
    greater = float(np.mean(u >= observed - tol))
    less = float(np.mean(u <= observed + tol))
    if alternative == "two-sided":
        return min(1.0, 2 * min(greater, less))
    return greater if alternative == "greater" else less
