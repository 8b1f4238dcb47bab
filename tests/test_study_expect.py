"""Expectations on result tables, checked against pandas computations, and their JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from probe.errors import ProbeError
from probe.study.verdicts.expect import check, check_all, parse_expectation, write_junit


def eval_table() -> pd.DataFrame:
    rows = []
    for arm, good in (("rope", 0.9), ("learned", 0.5)):
        for seed in (0, 1):
            for length in range(1, 9):
                exact = 1.0 if length <= 4 else good - 0.1 * seed
                rows.append({"arm": arm, "seed": seed, "L": 4, "length": length,
                             "metric": "exact_match", "value": exact})  # fmt: skip
                rows.append({"arm": arm, "seed": seed, "L": 4, "length": length,
                             "metric": "loss", "value": 1 - exact})  # fmt: skip
    return pd.DataFrame(rows)


def expect(**raw):
    return parse_expectation(raw, "test")


def test_per_group_mean_over_filtered_rows():
    table = eval_table()
    exp = expect(table="eval", metric="exact_match", where={"length": "> L"}, per=["arm"],
                 bound=">= 0.8")  # fmt: skip
    outcomes = {o.name: o for o in check(exp, {"eval": table})}
    rows = table[(table.metric == "exact_match") & (table.length > table.L)]
    means = rows.groupby("arm").value.mean()
    assert outcomes[f"{exp.name} [arm=rope]"].observed == pytest.approx(means["rope"])
    assert outcomes[f"{exp.name} [arm=rope]"].passed
    assert outcomes[f"{exp.name} [arm=learned]"].observed == pytest.approx(means["learned"])
    assert not outcomes[f"{exp.name} [arm=learned]"].passed


def test_list_of_comparisons_is_a_range_and_a_column_times_factor():
    table = eval_table()
    exp = expect(table="eval", metric="exact_match", where={"length": ["> L", "<= 2L"]},
                 reduce="min", bound=">= 0.3")  # fmt: skip
    [outcome] = check(exp, {"eval": table})
    rows = table[(table.metric == "exact_match") & (table.length > 4) & (table.length <= 8)]
    assert outcome.observed == pytest.approx(rows.value.min())
    assert outcome.passed


def test_baseline_difference_and_in_lists():
    table = eval_table()
    exp = expect(table="eval", metric="exact_match", where={"arm": "learned"},
                 baseline={"arm": "rope"}, per=["seed"], bound=">= -0.1")  # fmt: skip
    outcomes = check(exp, {"eval": table})
    ex = table[table.metric == "exact_match"]
    for o, seed in zip(outcomes, (0, 1), strict=True):
        diff = (ex[(ex.arm == "learned") & (ex.seed == seed)].value.mean()
                - ex[(ex.arm == "rope") & (ex.seed == seed)].value.mean())  # fmt: skip
        assert o.observed == pytest.approx(diff)
        assert not o.passed  # learned is 0.4 lower on half the lengths: 0.2 lower
    exp = expect(table="eval", metric="loss", where={"arm": ["rope"], "seed": 0}, bound="<= 1")
    [o] = check(exp, {"eval": table})
    assert o.observed == pytest.approx(table[(table.metric == "loss") & (table.arm == "rope")
                                             & (table.seed == 0)].value.mean())  # fmt: skip


def test_missing_table_column_or_rows_fail_with_a_reason():
    table = eval_table()
    [o] = check(expect(table="pruning", metric="exact_match", bound=">= 0"), {"eval": table})
    assert not o.passed and "no table 'pruning'" in o.detail
    [o] = check(expect(table="eval", metric="exact_match", where={"lenght": 3}, bound=">= 0"),
                {"eval": table})  # fmt: skip
    assert not o.passed and "Did you mean 'length'?" in o.detail
    [o] = check(expect(table="eval", metric="exact_match", where={"length": 99}, bound=">= 0"),
                {"eval": table})  # fmt: skip
    assert not o.passed and "no rows" in o.detail


def test_when_selects_full_or_smoke_runs():
    table = {"eval": eval_table()}
    full = expect(table="eval", metric="exact_match", bound=">= 0", when="full")
    smoke = expect(table="eval", metric="exact_match", bound=">= 0", when="smoke")
    assert len(check_all((full, smoke), table, smoke=True)) == 1
    assert len(check_all((full, smoke), table, smoke=False)) == 1
    with pytest.raises(ProbeError, match="when"):
        expect(table="eval", metric="exact_match", bound=">= 0", when="sometimes")


def test_junit_xml_counts_failures(tmp_path):
    table = {"eval": eval_table()}
    exp = expect(table="eval", metric="exact_match", where={"length": "> L"}, per=["arm"],
                 bound=">= 0.8")  # fmt: skip
    outcomes = check(exp, table)
    path = write_junit(tmp_path / "junit.xml", "tiny", outcomes, 1.5)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert (
        suite.get("name") == "tiny" and suite.get("tests") == "2" and suite.get("failures") == "1"
    )
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and "arm=learned" in failed[0].get("name")
    assert "expected >= 0.8" in failed[0].find("failure").get("message")


@pytest.mark.parametrize(("field", "value", "words"), [
    ("reduce", "meen", ["reduce", "Did you mean 'mean'?", "Available: mean, min, max"]),
    ("when", "ful", ["when", "Did you mean 'full'?", "Available: always, full, smoke"]),
])  # fmt: skip
def test_a_misspelt_choice_names_the_field_and_the_choices(field, value, words):
    from probe.study.verdicts.expect import parse_expectation

    raw = {"table": "eval", "metric": "exact_match", "bound": ">= 0.5", field: value}
    with pytest.raises(ProbeError) as info:
        parse_expectation(raw, "x.toml [[expect]] #1", ("eval",))
    assert str(info.value).startswith("x.toml [[expect]] #1")
    assert all(w in str(info.value) for w in words), info.value
