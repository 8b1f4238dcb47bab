"""[[expect]] and [[contrast]] in head studies: checked after a run and by `probe study report`,
shown in the report, written as JUnit XML, exit code 1 on a failure; a bad one is one line."""

from __future__ import annotations

import dataclasses
import json
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from cli_run import exit_code
from scipy import stats

from probe.errors import ProbeError
from probe.study.heads.spec import head_study_dict, parse_head_study, smoke_head_study
from probe.study.verdicts.checks import verdicts_from_dict
from probe.study.verdicts.expect import check_all

pytest.importorskip("transformers")

PASSING = """
[[expect]]
name = "the unpruned model's loss is finite"
table = "model"
metric = "loss"
bound = "< 1000"
"""
FAILING = """
[[expect]]
name = "half the heads go for free"
table = "curves"
metric = "loss"
where = { fraction = 0.5 }
per = ["method"]
bound = "< 0"
"""
CONTRAST = """
[[contrast]]
claim = "gradient rankings keep the loss lower than random ones"
table = "curves"
metric = "loss"
where = { fraction = 0.5, unit = "head" }
a = "gradient"
b = "random"
expect = "lower"
"""


def study_text(source: Path, verdicts: str = PASSING + FAILING + CONTRAST) -> str:
    return f"""
[study]
name = "tiny-verdicts"
question = "Do gradient rankings beat random ones on a tiny Llama?"

[model]
source = {json.dumps(str(source))}

[text]
max_tokens = 16
batch_size = 2
batches = 1
seeds = 3

[curves]
methods = ["gradient", "random"]
fractions = [0.0, 0.5]

[timing]
batch_sizes = [1]
repeats = 1

[operating]
tolerance = 0.5

[smoke]
text = {{ seeds = 2 }}
{verdicts}"""


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from test_cli_imported import hf_dir

    return hf_dir("llama", tmp_path_factory.mktemp("hf"))


def junit_cases(path: Path) -> dict[str, bool]:
    """testcase name -> whether it failed."""
    root = ET.parse(path).getroot()
    return {c.get("name"): c.find("failure") is not None for c in root.iter("testcase")}


def by_hand(curves: pd.DataFrame) -> tuple[float, str]:
    """The contrast's p and verdict from the curves table, with scipy directly."""
    rows = curves[(curves.fraction == 0.5) & (curves.unit == "head") & (curves.metric == "loss")]
    seeds = rows.groupby(["method", "seed"]).value.mean()
    x, y = seeds["gradient"].to_numpy(), seeds["random"].to_numpy()
    less = stats.mannwhitneyu(x, y, alternative="less", method="exact").pvalue
    greater = stats.mannwhitneyu(x, y, alternative="greater", method="exact").pvalue
    if less <= 0.05:
        return less, "supported"
    return less, "contradicted: the opposite direction" if greater <= 0.05 else "not shown"


def test_a_failing_expectation_fails_the_run_and_the_report(llama_dir, tmp_path, capsys):
    file = tmp_path / "tiny.toml"
    file.write_text(study_text(llama_dir))
    assert exit_code(["study", "validate", str(file)]) == 0
    assert "ok" in capsys.readouterr().out
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    assert exit_code(["study", "run", str(file), "--out", str(out), "--junit", str(junit)]) == 1
    run = capsys.readouterr()
    assert "expectations" in run.out and "FAIL" in run.out
    assert "2 of 3 expectations failed" in run.err
    assert run.out.rstrip().splitlines()[-1].startswith("Reproduction.")  # still the last line
    cases = junit_cases(junit)
    assert cases == {
        "the unpruned model's loss is finite": False,
        "half the heads go for free [method=gradient]": True,
        "half the heads go for free [method=random]": True,
    }
    report = (out / "report.md").read_text()  # written before the exit
    assert (
        report.index("## Verdicts") < report.index("## Expectations") < report.index("## Reproduce")
    )
    assert "Each claim compares two methods on one number per seed" in report
    answer = next(line for line in report.splitlines() if line.startswith("**Answer.**"))
    assert "Over seeds: gradient rankings keep the loss lower than random ones" in answer
    # the verdict is the one the exact Mann-Whitney test on the per-seed numbers implies
    p, verdict = by_hand(pd.read_csv(out / "tables" / "curves.csv"))
    row = pd.read_csv(out / "verdicts.csv").iloc[0]
    assert row.verdict == verdict and row.seeds == "3 vs 3"
    assert float(str(row.p).lstrip("<>= ").split()[0]) == pytest.approx(p, rel=1e-2)
    expectations = pd.read_csv(out / "expectations.csv")
    assert list(expectations.result.str.startswith("pass")) == [True, False, False]

    # the report rechecks them from the results directory alone
    again = tmp_path / "again.xml"
    assert exit_code(["study", "report", str(out), "--junit", str(again)]) == 1
    assert junit_cases(again) == cases
    assert (out / "report.md").read_text() == report

    # only passing expectations: exit 0 and every case passes
    file.write_text(study_text(llama_dir, PASSING + CONTRAST))
    assert exit_code(["study", "run", str(file), "--out", str(out), "--junit", str(junit)]) == 0
    assert junit_cases(junit) == {"the unpruned model's loss is finite": False}
    assert "0 steps run" in capsys.readouterr().out  # verdicts change no step's key


def test_expectations_and_contrasts_are_kept_with_the_results(llama_dir):
    data = tomllib.loads(study_text(llama_dir, PASSING + FAILING.replace(
        'bound = "< 0"', 'bound = "< 0"\nwhen = "full"') + CONTRAST))  # fmt: skip
    study = parse_head_study(data)
    assert [e.table for e in study.expectations] == ["model", "curves"]
    assert study.contrasts[0].column == "method"  # a head study's default
    # study.json holds them in a form read back exactly (what `probe study report` rechecks)
    stored = json.loads(json.dumps(head_study_dict(study)))
    assert verdicts_from_dict(stored) == (study.expectations, study.contrasts)
    smoke = smoke_head_study(study)
    assert smoke.expectations == study.expectations and smoke.text.seeds == 2
    # `when = "full"` is skipped in the smoke version
    tables = {"model": pd.DataFrame({"loss": [2.0]}),
              "curves": pd.DataFrame({"fraction": [0.5], "method": ["random"],
                                      "metric": ["loss"], "value": [3.0]})}  # fmt: skip
    assert [o.passed for o in check_all(study.expectations, tables, smoke=False)] == [True, False]
    assert [o.passed for o in check_all(study.expectations, tables, smoke=True)] == [True]
    # a study without them stores what it stored before (committed study.json files)
    bare = dataclasses.replace(study, expectations=(), contrasts=())
    assert "expect" not in head_study_dict(bare) and "contrasts" not in head_study_dict(bare)


BAD = [  # (id, where the text goes: "end", "top" or "smoke" (in [smoke]), text, words)
    ("expect-table", "end", PASSING.replace('"model"', '"curvs"'),
     ["table 'curvs'", "Did you mean 'curves'"]),
    ("expect-reduce", "end", PASSING + 'reduce = "meen"\n', ["reduce", "Did you mean 'mean'"]),
    ("expect-key", "end", PASSING + "fitted = true\n", ["[[expect]] #1", "'fitted'"]),
    ("contrast-fitted", "end", CONTRAST + "fitted = true\n", ["fitted = true", "head study"]),
    ("contrast-arm", "end", CONTRAST + 'column = "arm"\n', ['column = "arm"', "no arms"]),
    ("contrast-method", "end", CONTRAST.replace('"gradient"', '"gradiant"', 1),
     ["no method 'gradiant'", "Did you mean 'gradient'"]),
    ("contrast-table", "end", CONTRAST.replace('"curves"', '"curve"'), ["Did you mean 'curves'"]),
    ("contrast-not-list", "top", 'contrast = "x"\n', ["[[contrast]] tables"]),
    ("smoke-expect", "smoke", 'expect = [{ bound = "< 1" }]\n',
     ["[smoke]", "unknown field 'expect'"]),
]  # fmt: skip


@pytest.mark.parametrize(("at", "verdicts", "words"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])  # fmt: skip
def test_a_bad_expectation_or_contrast_is_one_line(llama_dir, tmp_path, capsys, at, verdicts,
                                                   words):  # fmt: skip
    file = tmp_path / "bad.toml"
    text = study_text(llama_dir, verdicts if at == "end" else "")
    if at == "smoke":
        text = text.replace("[smoke]\n", "[smoke]\n" + verdicts, 1)
    if at == "top":  # a top-level key: before the first table
        text = verdicts + text
    file.write_text(text)
    for command in (["study", "validate", str(file)],
                    ["study", "run", str(file), "--out", str(tmp_path / "out")]):  # fmt: skip
        assert exit_code(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert str(file) in err
        for word in words:
            assert word in err, (word, err)
    assert not (tmp_path / "out").exists()  # refused before anything ran
    with pytest.raises(ProbeError):
        parse_head_study(tomllib.loads(text), file)
