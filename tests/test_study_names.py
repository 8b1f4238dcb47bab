"""Names in a study's [[expect]] and [[contrast]] tables that the result tables do not have: one
line naming the study file, the entry, what is missing, a suggestion and what there is."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pandas as pd
import pytest

from probe.errors import ProbeError
from probe.study.verdicts.contrast import parse_contrast, verdict_table
from probe.study.verdicts.expect import check_all, parse_expectation


def eval_table() -> pd.DataFrame:
    return pd.DataFrame([
        {"arm": arm, "variant": "", "task": "copy", "seed": seed, "length": n, "L_min": 2, "L": 4,
         "metric": metric, "value": 0.5}
        for arm in ("a", "b") for seed in (0, 1, 2) for n in (2, 8)
        for metric in ("exact_match", "token_accuracy")
    ])  # fmt: skip


GOOD = {"table": "eval", "metric": "exact_match", "bound": ">= 0.4"}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({**GOOD, "metric": "exact_mach"},
         "table 'eval' has no metric 'exact_mach'. Did you mean 'exact_match'? Its metric "
         "values: exact_match, token_accuracy."),
        ({**GOOD, "per": ["armm"]}, "table 'eval' has no column 'armm'. Did you mean 'arm'?"),
        ({**GOOD, "where": {"lenght": 2}}, "has no column 'lenght'. Did you mean 'length'?"),
        ({**GOOD, "baseline": {"lenght": 2}}, "has no column 'lenght'. Did you mean 'length'?"),
    ],
)  # fmt: skip
def test_an_expectation_on_a_name_the_table_lacks_fails_with_one_line(raw, fragment):
    good = parse_expectation(GOOD, "x")
    bad = parse_expectation(raw, "x")
    outcomes = check_all((good, bad), {"eval": eval_table()}, smoke=False, where="s.toml")
    assert outcomes[0].passed  # the good one is checked as before
    [outcome] = outcomes[1:]
    assert not outcome.passed and outcome.observed is None
    assert outcome.detail.startswith("s.toml [[expect]] #2: table 'eval'"), outcome.detail
    assert fragment in outcome.detail and "\n" not in outcome.detail


CONTRAST = {"claim": "a beats b", "table": "eval", "metric": "exact_match", "a": "a", "b": "b"}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({**CONTRAST, "metric": "exact_mach"},
         "has no metric 'exact_mach'. Did you mean 'exact_match'?"),
        ({**CONTRAST, "per": ["armm"]}, "has no column 'armm'. Did you mean 'arm'?"),
        ({**CONTRAST, "column": "methd"}, "has no column 'methd'."),
    ],
)  # fmt: skip
def test_a_contrast_on_a_name_the_table_lacks_is_one_line_not_a_silent_no_data(raw, fragment):
    """A misspelt metric used to give no rows, a 'no data' verdict and no sentence at all."""
    contrasts = (parse_contrast(CONTRAST, "x", ("eval",)), parse_contrast(raw, "x", ("eval",)))
    assert len(verdict_table(contrasts[:1], {"eval": eval_table()})) == 1
    with pytest.raises(ProbeError) as info:
        verdict_table(contrasts, {"eval": eval_table()}, where="s.toml")
    message = str(info.value)
    assert message.startswith("s.toml [[contrast]] #2, contrast 'a beats b': table 'eval'")
    assert fragment in message and "\n" not in message


def test_the_report_names_the_study_file(tmp_path):
    from tiny_study import tiny_study

    from probe.study.grid.report import write_report
    from probe.study.grid.spec import parse_study

    text = tiny_study() + ('\n[[expect]]\ntable = "eval"\nmetric = "exact_mach"\nbound = ">= 0"\n')
    study = parse_study(tomllib.loads(text), Path("tiny.toml"))
    rows = eval_table().assign(cell="c")
    _, [outcome] = write_report(tmp_path, study, {"eval": rows}, {"seeds": [0, 1, 2]})
    assert outcome.detail.startswith("tiny.toml [[expect]] #1: table 'eval' has no metric")
