"""The verdicts' exact Mann-Whitney test under ties, against an enumeration of every split of
the pooled values written here (U from mid-ranks, counted over all C(n + m, n) splits), against
scipy's permutation test (every split) where each arm has two values or more, and against
scipy's exact table where no value is tied."""

from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np
import pytest
from scipy.stats import PermutationMethod, mannwhitneyu, rankdata

from probe.study.verdicts.stats import mann_whitney


def enumerated(x, y, alternative: str) -> float:
    pooled = [*x, *y]
    n, m = len(x), len(y)
    ranks = rankdata(pooled)  # mid-ranks for ties

    def u(idx) -> float:
        return sum(ranks[i] for i in idx) - n * (n + 1) / 2

    observed = u(range(n))
    splits = [u(idx) for idx in combinations(range(n + m), n)]
    assert len(splits) == comb(n + m, n)
    greater = sum(s >= observed - 1e-9 for s in splits) / len(splits)
    less = sum(s <= observed + 1e-9 for s in splits) / len(splits)
    if alternative == "two-sided":  # twice the smaller tail, as scipy's exact test doubles it
        return min(1.0, 2 * min(greater, less))
    return greater if alternative == "greater" else less


CASES = [
    ([0, 0, 0], [0, 0, 0]),  # two identical all-zero arms: no evidence at all
    ([1, 1, 0], [0, 0, 0]),
    ([0.5, 0.5, 1.0], [0.5, 0.0, 0.0]),
    ([3, 1, 2], [6, 5, 4]),  # no ties: the classic table
    ([1, 1, 1, 0], [1, 0, 0, 0, 0]),
    ([0.2, 0.2, 0.3, 0.3, 0.3], [0.2, 0.1, 0.3]),
    ([0.4], [0.1, 0.4, 0.2]),  # one seed against three (a smoke run's)
    ([2.0], [1.0]),
]


@pytest.mark.parametrize("x, y", CASES)
@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_the_exact_test_counts_every_split_ties_included(x, y, alternative):
    p = mann_whitney(x, y, alternative)
    assert p == pytest.approx(enumerated(x, y, alternative), abs=1e-12)
    if min(len(x), len(y)) >= 2:
        every = PermutationMethod(n_resamples=np.inf)
        assert p == pytest.approx(mannwhitneyu(x, y, alternative=alternative,
                                               method=every).pvalue, abs=1e-12)  # fmt: skip
    if len(set([*x, *y])) == len(x) + len(y):  # untied: the classic exact table
        assert p == pytest.approx(mannwhitneyu(x, y, alternative=alternative,
                                               method="exact").pvalue, abs=1e-12)  # fmt: skip


def test_many_seeds_go_to_a_seeded_monte_carlo_permutation_test():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 3, 11).tolist(), rng.integers(0, 3, 10).tolist()  # C(21, 10) splits
    every = PermutationMethod(n_resamples=np.inf)  # every split: seconds, so only here
    exact = mannwhitneyu(x, y, alternative="greater", method=every).pvalue
    estimate = mann_whitney(x, y, "greater")
    # 100,000 draws: within four standard errors of the exact p, and the same on every call
    assert abs(estimate - exact) < 4 * (exact * (1 - exact) / 100_000) ** 0.5
    assert mann_whitney(x, y, "greater") == estimate


def test_identical_arms_give_no_evidence():
    # scipy's method="exact" (the untied table) gives 0.65 here
    assert mann_whitney([0, 0, 0], [0, 0, 0], "greater") == 1.0
