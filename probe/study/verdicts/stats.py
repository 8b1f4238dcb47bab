"""Means over seeds with 95% bootstrap confidence intervals (scipy.stats.bootstrap), and the
tests the verdicts use: the exact Mann-Whitney test for independent seeds (`mann_whitney`) and
the sign-flip permutation test for paired ones (`sign_flip`)."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.stats import PermutationMethod, bootstrap, mannwhitneyu, rankdata

from probe.significance import ALPHA, ALPHA_EXACT

CONFIDENCE = 0.95
MOST_SPLITS = 200_000  # splits the exact test enumerates itself (20 seeds: 10 against 10)
MOST_FLIPPED = 20  # differences whose 2^n sign flips the paired test enumerates (about 1e6 sums)
DRAWS = 100_000  # seeded random sign flips past that
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


def smallest_p(n: int, m: int, two_sided: bool = False) -> float:
    """The smallest exact Mann-Whitney p with n against m values: 1 / C(n + m, n) one-sided,
    twice that two-sided."""
    return (2 if two_sided else 1) / math.comb(n + m, n)


def mann_whitney(x, y, alternative: str) -> float:
    """The exact Mann-Whitney p-value of `x` against `y` ("greater": x tends to be larger), ties
    included: U (mid-ranks) against its distribution over every one of the C(n + m, n) ways to
    split the pooled values, as a permutation test counts them (two-sided: twice the smaller
    tail, at most 1, as the untied exact test has it). scipy's method="exact" uses the table of
    untied values, which is wrong under ties (two identical all-zero arms of 3 seeds: 0.65 where
    every split gives the same U, p = 1)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]  # a missing number is no evidence either way
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return math.nan
    if math.comb(n + m, n) > MOST_SPLITS:  # many seeds: scipy's permutation test, seeded draws
        method = PermutationMethod(n_resamples=DRAWS, random_state=0)
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


def differences(x, y) -> np.ndarray:
    """The nonzero paired differences x - y (`x`, `y` aligned pair by pair): a pair whose two
    numbers are equal, up to float rounding, drops out, as in Wilcoxon's signed-rank test and
    the sign test."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    kept = ~(np.isnan(x) | np.isnan(y))  # a pair missing a number is no evidence either way
    x, y = x[kept], y[kept]
    same = np.isclose(x, y, rtol=1e-12, atol=1e-15)
    return x[~same] - y[~same]


def sign_flip(x, y, alternative: str, seed: int = 0) -> float:
    """The sign-flip permutation p-value of paired `x` against `y` ("greater": x - y tends to be
    positive): the sum of the nonzero differences (`differences`) against its value under every
    one of the 2^n ways to flip their signs, each equally likely when x and y are exchangeable
    within each pair (two-sided: twice the smaller tail, at most 1, as `mann_whitney`). Past
    MOST_FLIPPED differences, DRAWS seeded random flips estimate it as (hits + 1) / (DRAWS + 1)."""
    d = differences(x, y)
    observed = float(d.sum())
    tol = 1e-9 * float(np.abs(d).sum())  # relative: the p must not depend on the units
    sums = _flipped_sums(np.abs(d), seed)  # [flips]
    hits_greater = int(np.sum(sums >= observed - tol))
    hits_less = int(np.sum(sums <= observed + tol))
    exact = len(d) <= MOST_FLIPPED
    greater, less = ((h / len(sums)) if exact else (h + 1) / (len(sums) + 1)
                     for h in (hits_greater, hits_less))  # fmt: skip
    if alternative == "two-sided":
        return min(1.0, 2 * min(greater, less))
    return greater if alternative == "greater" else less


def _flipped_sums(size: np.ndarray, seed: int) -> np.ndarray:
    """The signed sums of `size` (magnitudes): all 2^n when n <= MOST_FLIPPED, else DRAWS draws."""
    if len(size) <= MOST_FLIPPED:
        sums = np.zeros(1)
        for v in size:  # each difference doubles the sums: + v or - v
            sums = np.concatenate([sums + v, sums - v])
        return sums
    rng = np.random.default_rng(seed)
    chunks = [rng.choice((-1.0, 1.0), size=(n, len(size))) @ size  # [n] per chunk of draws
              for n in [10_000] * (DRAWS // 10_000)]  # fmt: skip
    return np.concatenate(chunks)


def smallest_flip_p(n: int, two_sided: bool = False) -> float:
    """The smallest sign-flip p with `n` nonzero differences: 2^-n one-sided (every difference on
    the claimed side), twice that two-sided (at most 1)."""
    return min(1.0, (2 if two_sided else 1) * 0.5**n)


def mann_whitney_words(sides: str) -> str:
    """How a verdicts table compares `sides` ("arms", "methods") over independent seeds."""
    return (
        f"Each claim compares two {sides} on one number per seed (the mean, or for a spread the "
        "standard deviation, of the matching rows) with an exact one-sided Mann-Whitney test; "
        f"'supported' needs p <= {ALPHA:g} in the claimed direction, 'contradicted' p <= "
        f"{ALPHA:g} the other way. With 3 seeds against 3 the smallest possible p is "
        f"{smallest_p(3, 3):.2g}, so 'not shown' can mean too few seeds as well as no effect. "
        "A claim of no difference ('similar') is read from the exact two-sided test (3 against "
        f"3 seeds: at least {smallest_p(3, 3, two_sided=True):.2g})."
    )


def sign_flip_words(sides: str, units: str, alone: bool, similar: bool, estimated: bool) -> str:
    """How a verdicts table compares `sides` pair by pair (a pair: the same `units`, e.g.
    "seed and length"); `alone`: every claim is paired (else after `mann_whitney_words`);
    `similar`: some claims are of no difference; `estimated`: some p is a Monte-Carlo one."""
    need = next(n for n in range(1, 64) if smallest_flip_p(n) <= ALPHA)
    lead = (f"Each claim compares two {sides} pair by pair, a pair being their numbers for the "
            f"same {units} (the mean, or for a spread the standard deviation, of the matching "
            "rows)") if alone else (f"A claim counted in pairs compares the two sides pair by "
                                    f"pair, the same {units} on both")  # fmt: skip
    rules = (f"; 'supported' needs p <= {ALPHA:g} in the claimed direction, 'contradicted' p <= "
             f"{ALPHA:g} the other way") if alone else ""  # fmt: skip
    return (
        f"{lead}: the differences a - b are tested by an exact one-sided sign-flip permutation "
        "test (their sum against its value under all 2^n ways to flip the signs of the n pairs "
        "that differ; pairs with no difference drop out, as in Wilcoxon's signed-rank test)"
        f"{rules}. With n differing pairs the smallest possible p is 2^-n: 3 pairs cannot go "
        f"below {smallest_flip_p(3):.3g}, so they cannot support a claim, and it takes {need} "
        f"({smallest_flip_p(need):.2g}); 'not shown' can mean too few pairs as well as no effect."
        + (" A claim of no difference ('similar') is read from the two-sided test (at least "
           f"2^(1-n): {smallest_flip_p(3, two_sided=True):.2g} with 3 pairs)." if similar else "")
        + (f" With more than {MOST_FLIPPED} differing pairs p is estimated from {DRAWS:,} "
           "seeded random sign flips (marked Monte-Carlo)." if estimated else "")
    )  # fmt: skip


def multiplicity_words(tests: int, decided: list[float]) -> str:
    """That `tests` tests were made and nothing corrects for their number, with how many of the
    verdicts read from p <= ALPHA (`decided`: their p-values) a Bonferroni threshold, ALPHA /
    tests, would keep (compared as fractions, so no rounding moves a p across it)."""
    if tests < 2:
        return "" if tests == 0 else "The table makes one test, so there is no multiplicity."
    threshold = ALPHA_EXACT / int(tests)
    kept = sum(Fraction(p).limit_denominator(10**9) <= threshold for p in decided)
    held = (f"{kept} of the {len(decided)} 'supported' or 'contradicted' verdicts would still "
            "hold" if decided else f"no verdict here rests on p <= {ALPHA:g}, so it would "
            "change none")  # fmt: skip
    return (
        f"The table makes {tests} tests (one per row with a p-value) and no correction for "
        f"multiplicity was applied: a Bonferroni threshold would be {ALPHA:g} / {tests} = "
        f"{float(threshold):.3g}, and {held}."
    )
