"""The verdicts' exact Mann-Whitney test under ties, against an enumeration of every split of
the pooled values written here (U from mid-ranks, counted over all C(n + m, n) splits)."""

from __future__ import annotations

from itertools import combinations
from math import comb

import pytest
from scipy.stats import rankdata

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
]


@pytest.mark.parametrize("x, y", CASES)
@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_the_exact_test_counts_every_split_ties_included(x, y, alternative):
    assert mann_whitney(x, y, alternative) == pytest.approx(enumerated(x, y, alternative),
                                                            abs=1e-12)  # fmt: skip


def test_identical_arms_give_no_evidence():
    # scipy's method="exact" (the untied table) gives 0.65 here
    assert mann_whitney([0, 0, 0], [0, 0, 0], "greater") == 1.0
