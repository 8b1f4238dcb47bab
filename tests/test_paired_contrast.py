"""[[contrast]] with `paired`: the sign-flip test against enumeration written here, a tiny table
end to end (paired and unpaired disagree as they should), the spec's errors, and the sentence
saying how many tests a verdicts table makes."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from probe.errors import ProbeError
from probe.report.report import MarkdownReport
from probe.study.verdicts.checks import verdicts_dict, verdicts_from_dict
from probe.study.verdicts.contrast import (
    Contrast,
    evaluate,
    parse_contrast,
    verdict_table,
)
from probe.study.verdicts.contrast_text import section, sentence
from probe.study.verdicts.stats import (
    DRAWS,
    multiplicity_words,
    sign_flip,
    smallest_flip_p,
)


def brute_p(d: list[float]) -> tuple[float, float]:
    """(P(sum >= observed), P(sum <= observed)) over every sign assignment of every difference,
    zeros included (a zero's sign moves no sum, so keeping or dropping zeros gives one p)."""
    observed = sum(d)
    sums = [sum(s * abs(v) for s, v in zip(signs, d, strict=True))
            for signs in product((-1, 1), repeat=len(d))]  # fmt: skip
    eps = 1e-9
    return (sum(t >= observed - eps for t in sums) / len(sums),
            sum(t <= observed + eps for t in sums) / len(sums))  # fmt: skip


EXAMPLES = [
    [1.0, 2.0, 3.0],  # all one side: 1/8
    [1.0, 1.0, -1.0, 2.0, 0.0],  # ties in size and a zero
    [0.5, -0.5, 0.5, -0.5, 0.0, 0.0],  # sum 0, ties, two zeros
    [0.3, -0.1, 0.2, 0.2, -0.4, 0.7, 0.0, 0.1],  # sums that tie the observed one
    [0.0, 0.0, 0.0],  # nothing differs: p = 1 both ways
    [-2.0, -1.0, -3.0, 1.0],
]


@pytest.mark.parametrize("d", EXAMPLES)
def test_sign_flip_p_matches_enumeration_over_every_sign(d):
    y = [5.0] * len(d)  # x - y = d exactly: the pairs' common level never matters
    x = [5.0 + v for v in d]
    greater, less = brute_p(d)
    assert sign_flip(x, y, "greater") == pytest.approx(greater, abs=1e-12)
    assert sign_flip(x, y, "less") == pytest.approx(less, abs=1e-12)
    assert sign_flip(x, y, "two-sided") == pytest.approx(min(1.0, 2 * min(greater, less)))


def test_the_smallest_p_is_two_to_the_minus_differing_pairs():
    for n in range(1, 8):
        best = brute_p([1.0 + i for i in range(n)])[0]  # every difference on the claimed side
        assert smallest_flip_p(n) == pytest.approx(best) == pytest.approx(2.0**-n)
    assert smallest_flip_p(3) == 0.125 and smallest_flip_p(5) <= 0.05 < smallest_flip_p(4)
    assert smallest_flip_p(3, two_sided=True) == 0.25


def test_past_twenty_differences_a_seeded_monte_carlo_estimate_near_the_exact_p():
    d = [(-1) ** (i % 3 == 0) * (i % 7 + 1) for i in range(25)]  # integers: the exact
    counts = {0: 1}  # distribution of the flipped sum by convolution, sum -> ways
    for v in d:
        nxt: dict[int, int] = {}
        for s, ways in counts.items():
            for t in (s + abs(v), s - abs(v)):
                nxt[t] = nxt.get(t, 0) + ways
        counts = nxt
    exact = sum(w for s, w in counts.items() if s >= sum(d)) / 2 ** len(d)
    x, y = np.array(d, float), np.zeros(len(d))
    estimate = sign_flip(x, y, "greater")
    assert estimate == sign_flip(x, y, "greater")  # seeded: the same every time
    assert abs(estimate - exact) < 5 * np.sqrt(exact * (1 - exact) / DRAWS) + 1e-4
    row = evaluate(contrast(paired=("seed",)), arms(list(x), list(y))).iloc[0]
    assert not row["exact"] and "(Monte-Carlo)" in sentence(row, ())


def arms(a: list[float], b: list[float], lengths: tuple[int, ...] = (1,)) -> pd.DataFrame:
    """A long table: two arms, seed i of each arm at value a[i] (b[i]) plus the length (so
    lengths differ within a seed), and a length-99 row the contrast's where filters away."""
    rows = [{"arm": arm, "seed": i, "length": n, "metric": "m", "value": v + n}
            for arm, values in (("a", a), ("b", b)) for i, v in enumerate(values)
            for n in (*lengths, 99)]  # fmt: skip
    return pd.DataFrame(rows)


def contrast(expect: str = "higher", **more) -> Contrast:
    raw = {"claim": "a beats b", "table": "kv", "metric": "m", "a": "a", "b": "b",
           "expect": expect, "where": {"length": "< 99"}}  # fmt: skip
    return parse_contrast({**raw, **{k: list(v) for k, v in more.items()}}, "w", ("kv",))


def test_paired_seeds_find_the_shift_the_unpaired_test_cannot_see():
    # a is b plus 1 on every seed; the seeds themselves spread over 0..50
    b = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    a = [v + 1.0 for v in b]
    table = arms(a, b)
    unpaired = evaluate(contrast(), table).iloc[0]
    paired = evaluate(contrast(paired=("seed",)), table).iloc[0]
    mw = stats.mannwhitneyu(a, b, alternative="greater", method="exact").pvalue  # no ties
    assert unpaired["p_claim"] == pytest.approx(mw) and unpaired["verdict"] == "not shown"
    assert paired["p_claim"] == pytest.approx(brute_p([1.0] * 6)[0]) == pytest.approx(1 / 64)
    assert paired["verdict"] == "supported" and paired["n_pairs"] == 6
    assert "6 pairs, p = 0.0156, supported" in sentence(paired, ())
    assert "6 vs 6 seeds" in sentence(unpaired, ())
    lower = evaluate(contrast("lower", paired=("seed",)), table).iloc[0]
    assert lower["verdict"] == "contradicted: the opposite direction"


def test_pairs_by_seed_and_length_and_a_unit_without_a_partner():
    b = [0.0, 10.0, 20.0]
    a = [0.5, 9.0, 21.0]  # differences 0.5, -1, 1 at every length
    table = arms(a, b, lengths=(1, 2))
    by_seed = evaluate(contrast(paired=("seed",)), table).iloc[0]  # mean over the two lengths
    assert by_seed["n_pairs"] == 3
    assert by_seed["p_claim"] == pytest.approx(brute_p([0.5, -1.0, 1.0])[0])
    assert by_seed["verdict"] == "not testable: 3 pairs cannot reach p <= 0.05"
    cells = evaluate(contrast(paired=("seed", "length")), table).iloc[0]
    assert cells["n_pairs"] == 6
    assert cells["p_claim"] == pytest.approx(brute_p([0.5, -1.0, 1.0] * 2)[0])
    lost = table[~((table["arm"] == "b") & (table["seed"] == 2) & (table["length"] == 2))]
    row = evaluate(contrast(paired=("seed", "length")), lost).iloc[0]
    assert (row["n_pairs"], row["unmatched"]) == (5, 1)
    assert row["p_claim"] == pytest.approx(brute_p([0.5, -1.0, 1.0, 0.5, -1.0])[0])
    assert "5 pairs (1 unit without a partner dropped)" in sentence(row, ())
    same = evaluate(contrast(paired=("seed",)), arms(b, b)).iloc[0]
    assert same["p_claim"] == 1.0
    assert same["verdict"] == "not testable: 3 pairs (none differing) cannot reach p <= 0.05"


def test_similar_reads_the_two_sided_sign_flip_p():
    b = [float(v) for v in range(6)]
    row = evaluate(contrast("similar", paired=("seed",)), arms([v + 1 for v in b], b)).iloc[0]
    assert row["p_two"] == pytest.approx(2 / 64)
    assert row["verdict"] == "contradicted: a difference was detected"
    three = evaluate(contrast("similar", paired=("seed",)), arms([1.0, 2.0, 3.0], [0.0] * 3))
    assert three.iloc[0]["verdict"].startswith("no difference detected: 3 pairs cannot reach a")


def test_paired_spec_errors_are_one_line():
    good = {"claim": "c", "table": "kv", "metric": "m", "a": "x", "b": "y"}
    for bad in ([], [""], [3], ["seed", "seed"], {"seed": 1}):
        with pytest.raises(ProbeError, match=r"^w paired must be a non-empty list of distinct "):
            parse_contrast({**good, "paired": bad}, "w", ("kv",))
    with pytest.raises(ProbeError, match=r"names 'method', the column a and b are values of"):
        parse_contrast({**good, "column": "method", "paired": ["seed", "method"]}, "w", ("kv",))
    with pytest.raises(ProbeError, match=r"names 'length', which baseline fixes"):
        parse_contrast({**good, "paired": ["seed", "length"], "baseline": {"length": 2}}, "w",
                       ("kv",))  # fmt: skip
    with pytest.raises(ProbeError, match=r"unknown field 'pairs'\. Did you mean 'paired'"):
        parse_contrast({**good, "pairs": ["seed"]}, "w", ("kv",))
    assert parse_contrast({**good, "paired": "seed"}, "w", ("kv",)).paired == ("seed",)
    fitted = parse_contrast({**good, "paired": ["seed"], "fitted": True}, "w", ("kv",))
    assert fitted.fitted and fitted.paired == ("seed",)  # a gate on the arms, not on pairing
    typo = contrast(paired=("seed", "lenght"))
    with pytest.raises(ProbeError, match=r"^x\.toml \[\[contrast\]\] #1, contrast 'a beats b': "
                       r"table 'kv' has no column 'lenght'\. Did you mean 'length'\?"):  # fmt: skip
        verdict_table((typo,), {"kv": arms([1.0], [0.0])}, "x.toml")


def test_paired_survives_study_json_and_older_json_reads_unpaired():
    c = contrast(paired=("seed", "length"))
    stored = verdicts_dict((), (c,))
    assert verdicts_from_dict(stored)[1] == (c,)
    del stored["contrasts"][0]["paired"]
    assert verdicts_from_dict(stored)[1][0].paired == ()


def bonferroni_by_hand(ps: list[float], decided: list[float]) -> tuple[float, int]:
    threshold = Fraction(1, 20) / len(ps)
    return float(threshold), sum(Fraction(p) <= threshold for p in decided)


def test_the_report_says_how_many_tests_and_what_bonferroni_would_keep(tmp_path):
    # four groups: 7 pairs a above b (p = 1/128), 6 (1/64), 3 (1/8), 6 pairs of no difference
    rows = []
    shifts = {"g7": (7, 1.0), "g6": (6, 1.0), "g3": (3, 1.0), "none": (6, 0.0)}
    for group, (n, shift) in shifts.items():
        for arm, add in (("a", shift), ("b", 0.0)):
            rows += [{"arm": arm, "seed": i, "group": group, "metric": "m", "value": 10 * i + add}
                     for i in range(n)]  # fmt: skip
    table = pd.DataFrame(rows)
    c = parse_contrast({"claim": "a beats b", "table": "kv", "metric": "m", "a": "a", "b": "b",
                        "per": ["group"], "paired": ["seed"]}, "w", ("kv",))  # fmt: skip
    verdicts = verdict_table((c,), {"kv": table})
    assert list(verdicts["group"]) == ["g3", "g6", "g7", "none"]
    assert list(verdicts["p_claim"]) == pytest.approx([1 / 8, 1 / 64, 1 / 128, 1.0])
    assert list(verdicts["verdict"][1:3]) == ["supported", "supported"]
    threshold, kept = bonferroni_by_hand([1 / 8, 1 / 64, 1 / 128, 1.0], [1 / 64, 1 / 128])
    assert (threshold, kept) == (0.0125, 1)
    rep = MarkdownReport(tmp_path, "t")
    section(rep, (c,), {"kv": table}, sides="methods")
    text = "\n".join(str(b) for b in rep.blocks)
    assert (
        "The table makes 4 tests (one per row with a p-value) and no correction for "
        "multiplicity was applied: a Bonferroni threshold would be 0.05 / 4 = 0.0125, and 1 "
        "of the 2 'supported' or 'contradicted' verdicts would still hold."
    ) in text
    assert "2^-n: 3 pairs cannot go below 0.125" in text and "| pairs |" in text
    assert "| 7 pairs | 0.00781 | supported |" in text
    unpaired = Contrast(**{**c.__dict__, "paired": ()})
    rep = MarkdownReport(tmp_path, "t")
    section(rep, (unpaired, c), {"kv": table}, sides="methods")
    text = "\n".join(str(b) for b in rep.blocks)
    assert "Each claim compares two methods on one number per seed" in text
    assert "A claim counted in pairs compares" in text and "The table makes 8 tests" in text
    assert "| seeds or pairs |" in text and "| 7 vs 7 |" in text


def test_the_count_sentence_for_one_test_and_for_no_decided_verdict():
    assert multiplicity_words(0, []) == ""
    assert multiplicity_words(1, [0.01]) == "The table makes one test, so there is no multiplicity."
    assert multiplicity_words(4, []).endswith(
        "0.05 / 4 = 0.0125, and no verdict here rests on p <= 0.05, so it would change none."
    )
    assert "1 of the 2" in multiplicity_words(4, [0.0125, 0.0126])  # 0.05 / 4 exactly is kept
