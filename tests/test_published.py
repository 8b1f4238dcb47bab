"""The comparison with a published ranking: Kendall's S and tau-b against scipy, the exact
permutation p-value against scipy's exact test, and each rule of probe.study.verdicts.published."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from probe.references import load_references, published
from probe.study.verdicts import summary
from probe.study.verdicts.published import (
    ALPHA,
    compare_ranking,
    decide,
    kendall_s,
    kendall_tau_b,
    permutation_p,
)

PAPER = {"none": 1, "t5": 2, "alibi": 3, "rope": 4.5, "sinusoidal": 4.5}


@pytest.mark.parametrize(
    "x, y",
    [([0.9, 0.5, 0.4, 0.1], [4, 3, 2, 1]), ([0.2, 0.5, 0.5, 0.9, 0.0], [5, 4, 3, 1.5, 1.5]),
     ([1.0, 0.0, 0.3, 0.3, 0.7, 0.2], [1, 2, 3, 4, 5, 6])],
)  # fmt: skip
def test_kendall_matches_scipy(x, y):
    assert kendall_tau_b(x, y) == pytest.approx(kendalltau(x, y).statistic)
    pairs = list(itertools.combinations(range(len(x)), 2))
    by_hand = sum((x[i] - x[j]) * (y[i] - y[j]) > 0 for i, j in pairs) - sum(
        (x[i] - x[j]) * (y[i] - y[j]) < 0 for i, j in pairs
    )
    assert kendall_s(x, y) == by_hand


@pytest.mark.parametrize("x", [[0.9, 0.5, 0.4, 0.1, 0.3], [0.1, 0.2, 0.9, 0.3, 0.5, 0.4]])
def test_permutation_p_matches_scipys_exact_test(x):
    y = list(range(len(x), 0, -1))
    p_agree, p_disagree = permutation_p(x, y)
    assert float(p_agree) == pytest.approx(
        kendalltau(x, y, method="exact", alternative="greater").pvalue
    )
    assert float(p_disagree) == pytest.approx(
        kendalltau(x, y, method="exact", alternative="less").pvalue
    )
    assert permutation_p([0.9, 0.5, 0.4, 0.1], [4, 3, 2, 1])[0] == Fraction(1, 24)


def test_verdicts_are_exact_fractions_and_integers():
    # p exactly at ALPHA agrees; nothing here is a float that rounding could push across the line
    assert decide(ALPHA, Fraction(1), 1, 6) == "agrees"
    assert decide(ALPHA + Fraction(1, 10**12), Fraction(1), 1, 6) == "inconclusive"
    assert decide(Fraction(1), Fraction(1, 24), -6, -2) == "disagrees"
    assert decide(Fraction(1, 120), Fraction(1), 0, 10) == "inconclusive"  # seeds do not back it
    # a fitted mean that float arithmetic puts a hair under 0.95 still fits
    almost = float(np.mean([0.95] * 3))  # three seeds at exactly 0.95
    assert almost < 0.95
    assert summary.fitted(pd.DataFrame({"mean": [almost, 0.949]})).tolist() == [True, False]


def frames(unseen: dict, seen: dict, noise: float = 0.0, tasks=("copy", "reverse")):
    """Per-seed unseen exact match (three seeds: value - noise, value, value + noise) and the
    seen summary (mean at the training lengths) per arm and task."""
    per_seed, rows = [], []
    for task in tasks:
        for arm, value in unseen.items():
            for seed, delta in enumerate((-noise, 0.0, noise)):
                per_seed.append({"arm": arm, "task": task, "seed": seed, "value": value + delta})
            rows.append({"arm": arm, "task": task, "mean": seen.get((arm, task), 1.0)})
    return pd.DataFrame(per_seed), pd.DataFrame(rows)


def test_agreement_disagreement_and_seed_noise():
    paper_order = {"none": 0.8, "t5": 0.6, "alibi": 0.4, "rope": 0.2, "sinusoidal": 0.1}
    per_seed, seen = frames(paper_order, {})
    verdicts = {c.scope: c.verdict for c in compare_ranking(per_seed, seen, PAPER)}
    assert verdicts == {"copy": "agrees", "reverse": "agrees", "across tasks": "agrees"}
    backwards = {a: 1 - v for a, v in paper_order.items()}
    per_seed, seen = frames(backwards, {})
    assert {c.verdict for c in compare_ranking(per_seed, seen, PAPER)} == {"disagrees"}
    # the same point estimates with seeds that swap neighbours: the seeds do not back a verdict
    per_seed, seen = frames(paper_order, {}, noise=1.5)
    copy = compare_ranking(per_seed, seen, PAPER)[0]
    assert copy.s > 0 and copy.p_agree <= ALPHA and copy.s_low <= 0
    assert copy.verdict == "inconclusive"


def test_only_fitted_arms_are_ranked_and_too_few_gives_no_verdict():
    unseen = {"none": 0.1, "t5": 0.0, "alibi": 0.9, "rope": 0.05, "sinusoidal": 0.0}
    seen = {("none", "reverse"): 0.66, ("t5", "reverse"): 0.94}  # fitted everywhere else
    per_seed, seen_summary = frames(unseen, seen)
    copy, reverse, across = compare_ranking(per_seed, seen_summary, PAPER)
    assert set(copy.arms) == set(PAPER) and copy.left_out == ()
    assert reverse.arms == ("alibi", "rope", "sinusoidal") and set(reverse.left_out) == {
        "none",
        "t5",
    }
    assert reverse.verdict == "too few to compare" and reverse.s is None
    assert across.verdict == "too few to compare" and set(across.left_out) == {"none", "t5"}


def test_fitted_check_is_restricted_to_the_compared_tasks():
    # alibi does not fit addition, which is not compared (no unseen rows for it): it still
    # counts as fitted on copy and reverse, and so across tasks
    unseen = {"none": 0.6, "t5": 0.5, "alibi": 0.9, "rope": 0.1}
    per_seed, seen_summary = frames(unseen, {})
    extra = pd.DataFrame([{"arm": a, "task": "addition", "mean": 0.0} for a in unseen])
    comparisons = compare_ranking(per_seed, pd.concat([seen_summary, extra]), PAPER)
    assert [c.scope for c in comparisons] == ["copy", "reverse", "across tasks"]
    assert all("alibi" in c.arms for c in comparisons)
    assert comparisons[-1].s is not None  # four arms: a verdict is given


def test_the_references_file_names_its_sources():
    for entry in load_references().values():
        assert entry.cite and entry.setting_source
        if entry.ranking is not None:
            assert entry.ranking.source
        assert all(v.source for v in entry.values)
    paper = published("kazemnejad2023")
    assert paper.ranking.ranks["none"] == 1
    with pytest.raises(Exception, match="Did you mean 'kazemnejad2023'"):
        published("kazemnejad2024")
