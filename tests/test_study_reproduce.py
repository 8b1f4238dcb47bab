"""A run's report says whether it reproduced the committed reference (results/NAME): identical
tables when seeds and torch match, else summary numbers checked against its intervals."""

from __future__ import annotations

import shutil
import tomllib

import pandas as pd
import pytest
from tiny_study import tiny_study

from probe.study.grid.report import write_report
from probe.study.grid.spec import parse_study
from probe.study.runner import load_tables, run_study
from probe.study.verdicts import reproduce


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro")
    study = parse_study(tomllib.loads(tiny_study(steps=4)))
    run_study(study, root / "results" / "tiny")
    result = run_study(study, root / "runs" / "tiny")
    return root, study, result


def sentence(root, study, result, monkeypatch) -> str:
    monkeypatch.setattr(reproduce, "REFERENCE_ROOT", root / "results")
    path, _ = write_report(root / "runs" / "tiny", study, result.tables, result.manifest)
    last = path.read_text().strip().splitlines()[-1]
    assert last.startswith("**Reproduction.**")
    return last


def test_same_seeds_same_torch_reproduce_exactly(runs, monkeypatch):
    root, study, result = runs
    text = sentence(root, study, result, monkeypatch)
    assert "reproduced the committed reference" in text and "exactly" in text


def test_a_changed_reference_is_checked_against_its_intervals(runs, monkeypatch, tmp_path):
    root, study, result = runs
    copy = tmp_path / "results" / "tiny"
    shutil.copytree(root / "results" / "tiny", copy)
    eval_csv = copy / "tables" / "eval.csv"
    table = pd.read_csv(eval_csv, keep_default_na=False, na_values=[""])
    seen = (table.metric == "exact_match") & table.length.between(table.L_min, table.L)
    table.loc[seen, "value"] = 1.0  # a reference that copies perfectly: far from this run
    table.to_csv(eval_csv, index=False)
    monkeypatch.setattr(reproduce, "REFERENCE_ROOT", tmp_path / "results")
    path, _ = write_report(root / "runs" / "tiny", study, result.tables, result.manifest)
    text = path.read_text().strip().splitlines()[-1]
    ours = load_tables(root / "runs" / "tiny")["eval"]
    seen_here = ours[(ours.metric == "exact_match") & ours.length.between(ours.L_min, ours.L)]
    assert seen_here.value.mean() < 0.5  # 4 training steps: far from the perfect reference
    assert "did not reproduce" in text and "not identical" in text
    assert "seen" in text.split("outside:")[1]


def test_no_reference_no_line(runs, monkeypatch, tmp_path):
    root, study, result = runs
    monkeypatch.setattr(reproduce, "REFERENCE_ROOT", tmp_path / "nowhere")
    path, _ = write_report(root / "runs" / "tiny", study, result.tables, result.manifest)
    assert "**Reproduction.**" not in path.read_text()


def test_wall_clock_columns_are_left_out_and_the_rest_must_match():
    timing = pd.DataFrame(
        {"cell": ["a", "a"], "part": ["model", "attention"], "seconds": [0.10, 0.05],
         "ratio": [0.9, 0.8], "params": [10, 10]}
    )  # fmt: skip
    slower = timing.assign(seconds=[0.20, 0.07], ratio=[0.95, 0.7])  # another run's clock
    assert reproduce.same_values(timing, slower) == (True, 0.0)
    smaller = slower.assign(params=[10, 9])  # a measured count that differs is not reproduced
    assert reproduce.same_values(timing, smaller)[0] is False
