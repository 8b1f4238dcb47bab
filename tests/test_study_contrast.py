"""[[contrast]]: verdicts from an exact Mann-Whitney test over seeds, checked by hand."""

from __future__ import annotations

import math
import tomllib
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tiny_study import SMOKE, tiny_study

from probe.errors import ProbeError
from probe.study.grid.spec import parse_study
from probe.study.verdicts.contrast import Contrast, evaluate, parse_contrast, smallest_p
from probe.study.verdicts.expect import parse_conditions


def table(a: list[float], b: list[float], noise: float = 0.0) -> pd.DataFrame:
    """An eval-like table: two arms, one seed per value, a row at length 2 and one at 9 (the
    second must be filtered away by the contrast's where)."""
    rows = []
    for arm, values in (("a", a), ("b", b)):
        for seed, v in enumerate(values):
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "task": "copy",
                    "length": 2,
                    "L": 4,
                    "metric": "exact_match",
                    "value": v,
                }
            )
            rows.append({"arm": arm, "seed": seed, "task": "copy", "length": 9, "L": 4,
                         "metric": "exact_match", "value": 100.0 + noise})  # fmt: skip
    return pd.DataFrame(rows)


def contrast(expect: str = "higher", within: str = "mean") -> Contrast:
    return Contrast(claim="a beats b", table="eval", metric="exact_match", a="a", b="b",
                    expect=expect, where=parse_conditions({"length": "<= L"}, "w"),
                    per=("task",), within=within)  # fmt: skip


def exact_p(x: list[float], y: list[float]) -> float:
    """P(U >= u) by enumerating every split of the pooled values (no ties in these tests)."""
    pooled, n = x + y, len(x)

    def u(xs, ys):
        return sum((a > b) + 0.5 * (a == b) for a in xs for b in ys)

    observed = u(x, y)
    splits = list(combinations(range(len(pooled)), n))
    hits = 0
    for idx in splits:
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(len(pooled)) if i not in idx]
        hits += u(xs, ys) >= observed
    return hits / len(splits)


def test_separated_arms_are_supported_at_the_smallest_possible_p():
    row = evaluate(contrast(), table([0.9, 0.8, 0.95], [0.1, 0.3, 0.2])).iloc[0]
    assert row["p_claim"] == pytest.approx(1 / math.comb(6, 3)) == pytest.approx(0.05)
    assert row["verdict"] == "supported"
    assert row["mean_a"] == pytest.approx((0.9 + 0.8 + 0.95) / 3)  # the length-9 rows left out


def test_p_matches_enumeration_and_opposite_direction_is_contradicted():
    x, y = [0.2, 0.5, 0.1, 0.4], [0.6, 0.3, 0.9, 0.7]
    row = evaluate(contrast(), table(x, y)).iloc[0]
    assert row["p_claim"] == pytest.approx(exact_p(x, y))
    assert row["p_other"] == pytest.approx(exact_p(y, x))
    lower = evaluate(contrast("lower"), table([0.1, 0.2, 0.0], [0.5, 0.6, 0.7])).iloc[0]
    assert lower["verdict"] == "supported"
    flipped = evaluate(contrast(), table([0.1, 0.2, 0.0], [0.5, 0.6, 0.7])).iloc[0]
    assert flipped["verdict"].startswith("contradicted")


def test_similar_and_untestable_verdicts():
    same = evaluate(contrast("similar"), table([0.5, 0.7, 0.6], [0.55, 0.65, 0.75])).iloc[0]
    assert same["verdict"].startswith("no difference detected")
    two = evaluate(contrast(), table([0.9, 0.8], [0.1, 0.2])).iloc[0]  # 2 vs 2: p >= 1/6
    assert smallest_p(2, 2) == pytest.approx(1 / 6)
    assert two["verdict"].startswith("not testable")


def test_spread_within_seed_is_the_standard_deviation_of_the_rows():
    df = pd.concat([table([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]).assign(head=h) for h in range(2)])
    df.loc[(df["arm"] == "a") & (df["head"] == 1) & (df["length"] == 2), "value"] = 1.0
    row = evaluate(contrast(within="std"), df).iloc[0]
    assert row["mean_a"] == pytest.approx(0.5)  # std of [0, 1] (population)
    assert row["mean_b"] == pytest.approx(0.0)


def test_a_wide_table_column_is_the_metric_and_a_missing_column_is_named():
    long = table([0.9, 0.8, 0.95], [0.1, 0.3, 0.2])
    wide = long.drop(columns="metric").rename(columns={"value": "exact_match"})
    row, again = evaluate(contrast(), long).iloc[0], evaluate(contrast(), wide).iloc[0]
    assert (row["mean_a"], row["p_claim"]) == (again["mean_a"], again["p_claim"])
    with pytest.raises(ProbeError, match=r"contrast 'a beats b': table 'eval' has no column "
                                         r"'task'.* Columns: arm, seed,"):  # fmt: skip
        evaluate(contrast(), long.drop(columns="task"))


def test_spec_errors_are_one_line():
    good = {"claim": "c", "table": "eval", "metric": "exact_match", "a": "x", "b": "y"}
    with pytest.raises(ProbeError, match="not one the study writes"):
        parse_contrast({**good, "table": "evl"}, "w", ("eval",))
    with pytest.raises(ProbeError, match="expect must be one of"):
        parse_contrast({**good, "expect": "bigger"}, "w", ("eval",))
    with pytest.raises(ProbeError, match="needs 'a'"):
        parse_contrast({k: v for k, v in good.items() if k != "a"}, "w", ("eval",))
    study = tiny_study(extra=SMOKE) + (
        '\n[[contrast]]\nclaim = "c"\ntable = "eval"\nmetric = "exact_match"\n'
        'a = "learned"\nb = "rpoe"\n'
    )
    with pytest.raises(ProbeError, match=r"no arm 'rpoe'\. Did you mean 'rope'"):
        parse_study(tomllib.loads(study), Path("x.toml"))


def test_baseline_makes_each_seed_a_change_within_the_model():
    # length 9 rows are 100 for every seed; the change from length 2 is 100 - value at 2
    c = Contrast(claim="a rises less", table="eval", metric="exact_match", a="a", b="b",
                 expect="lower", where=parse_conditions({"length": 9}, "w"),
                 baseline=parse_conditions({"length": 2}, "w"))  # fmt: skip
    row = evaluate(c, table([0.9, 0.8, 0.95], [0.1, 0.3, 0.2])).iloc[0]
    assert row["mean_a"] == pytest.approx(100 - (0.9 + 0.8 + 0.95) / 3)
    assert row["mean_b"] == pytest.approx(100 - 0.2)
    assert row["verdict"] == "supported"  # a's change (about 99.1) is below b's (99.8)


def test_fitted_contrast_compares_only_arms_that_fit_their_training_lengths():
    from probe.study.verdicts.contrast import verdict_table

    eval_table = table([1.0, 0.98, 0.99], [0.5, 0.6, 0.4]).assign(L_min=2, variant="")
    claim = Contrast(claim="a generalizes better", table="eval", metric="exact_match", a="a",
                     b="b", where=parse_conditions({"length": "> L"}, "w"))  # fmt: skip
    fitted = Contrast(**{**claim.__dict__, "fitted": True})
    rows = verdict_table((claim, fitted), {"eval": eval_table})
    assert not rows.iloc[0]["verdict"].startswith("not compared")
    assert rows.iloc[1]["verdict"] == (
        "not compared: b (0.50) does not fit its training lengths (exact match < 0.95)"
    )


def test_similar_is_read_from_the_two_sided_exact_p():
    """3 against 3 fully separated: each one-sided p is 1/20, the two-sided p 2/20 = 0.1 (by
    enumeration, and as scipy.stats computes it), so no difference is detected at 0.05 and the
    row prints the two-sided p; 4 against 4 separated: 2/70 < 0.05, a difference."""
    from scipy import stats

    from probe.study.verdicts.contrast_text import _p

    x, y = [0.9, 0.8, 0.95], [0.1, 0.3, 0.2]
    row = evaluate(contrast("similar"), table(x, y)).iloc[0]
    by_hand = 2 * min(exact_p(x, y), exact_p(y, x))
    assert by_hand == pytest.approx(2 / 20)
    assert row["p_two"] == pytest.approx(by_hand)
    assert row["p_two"] == pytest.approx(stats.mannwhitneyu(x, y, method="exact").pvalue)
    assert row["verdict"].startswith("no difference detected: 3 against 3 seeds cannot reach")
    assert _p(row) == "0.1 (two-sided)"
    x4, y4 = [0.9, 0.8, 0.95, 0.85], [0.1, 0.3, 0.2, 0.25]
    row4 = evaluate(contrast("similar"), table(x4, y4)).iloc[0]
    assert row4["p_two"] == pytest.approx(2 / math.comb(8, 4))
    assert row4["verdict"] == "contradicted: a difference was detected"
    mixed = [0.5, 0.7, 0.6, 0.2], [0.55, 0.65, 0.75, 0.1]
    row_m = evaluate(contrast("similar"), table(*mixed)).iloc[0]
    assert row_m["p_two"] == pytest.approx(
        min(1.0, 2 * min(exact_p(*mixed), exact_p(mixed[1], mixed[0])))
    )


def test_a_shown_value_never_rounds_across_its_threshold():
    from probe.study.verdicts.contrast import verdict_table
    from probe.study.verdicts.stats import fmt_ci, fmt_vs

    assert fmt_vs(0.9468, 0.95) == "0.947"  # "0.95" would read as fitted
    assert fmt_vs(0.951, 0.95) == "0.951"  # "0.95" would read as equal
    assert fmt_vs(0.95, 0.95) == "0.95"
    assert fmt_vs(0.5, 0.95) == "0.50"
    assert fmt_vs(0.04996, 0.05, 3, "g") == "0.04996"
    assert fmt_vs(0.0502, 0.05, 3, "g") == "0.0502"
    assert fmt_vs(np.float64(0.9468), 0.95) == "0.947"  # numpy numbers too
    assert fmt_ci(0.9468, 0.93, 0.96, threshold=0.95) == "0.947 [0.930, 0.960]"
    eval_table = table([0.9468] * 3, [0.99] * 3).assign(L_min=2, variant="")
    where = parse_conditions({"length": "> L"}, "w")
    fitted = Contrast(claim="a generalizes better", table="eval", metric="exact_match", a="a",
                      b="b", where=where, fitted=True)  # fmt: skip
    rows = verdict_table((fitted,), {"eval": eval_table})
    assert rows.iloc[0]["verdict"].startswith("not compared: a (0.947) does not fit")
