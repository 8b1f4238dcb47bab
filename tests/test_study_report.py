"""The report: sections from hand-made tables, ranks and the published comparison checked by
hand, files beside report.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from probe.study import summary
from probe.study.reporting import write_report
from probe.study.spec import Reference, parse_study

STUDY = """
[study]
name = "fake"
question = "Which encoding generalizes?"
[base.model]
n_layer = 1
d_model = 16
n_head = 2
[base.train]
train_len = [2, 4]
[grid]
model.pe = ["none", "rope", "learned"]
task.name = ["copy", "reverse"]
train.seed = [0, 1, 2]
[analysis.eval_lengths]
lengths = "1:2L"
[[expect]]
table = "eval"
metric = "exact_match"
where = { length = ["<= L", ">= L_min"] }
per = ["arm"]
bound = ">= 0.9"
[reference]
source = "Someone et al. 2023, a paper"
metric = "exact_match"
lengths = "unseen"
names = { none = "NoPE" }
[reference.values]
copy = { none = 0.9, rope = 0.1, learned = 0.0 }
reverse = { none = 0.2, rope = 0.3, learned = 0.1 }
[reference.mrr]
none = 0.75
rope = 0.75
learned = 0.33
"""

UNSEEN = {"none": 0.8, "rope": 0.4, "learned": 0.0}  # our exact match past L, both tasks


def fake_tables() -> dict[str, pd.DataFrame]:
    rows, attention, train = [], [], []
    for arm, past in UNSEEN.items():
        for task in ("copy", "reverse"):
            for seed in (0, 1, 2):
                ids = {"cell": f"{arm}{task}{seed}", "arm": arm, "variant": "", "pe": arm,
                       "task": task, "seed": seed, "L_min": 2, "L": 4}  # fmt: skip
                for length in range(1, 9):
                    fits = 0.5 if (arm, task) == ("learned", "reverse") else 1.0
                    exact = fits if length <= 4 else past + 0.01 * seed
                    for metric, value in (("exact_match", exact), ("token_accuracy", exact)):
                        rows.append({**ids, "length": length, "metric": metric, "value": value,
                                     "n": 8})  # fmt: skip
                    attention.append({**ids, "length": length, "layer": 0, "site": "blocks.0.attn",
                                      "head": 0, "statistic": "normalized_entropy",
                                      "value": 0.5 + 0.01 * length})  # fmt: skip
                for step in range(1, 11):
                    train.append({**ids, "step": step, "split": "train", "length": 3,
                                  "metric": "loss", "value": 1 / step})  # fmt: skip
    return {"eval": pd.DataFrame(rows), "attention": pd.DataFrame(attention),
            "train": pd.DataFrame(train)}  # fmt: skip


MANIFEST = {"seeds": [0, 1, 2], "device": "cpu", "git_commit": None, "created": "now",
            "cells": [], "file": "studies/fake.toml"}  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    study = parse_study(tomllib.loads(STUDY), Path("fake.toml"))
    path, outcomes = write_report(out, study, fake_tables(), MANIFEST)
    return out, path.read_text(), outcomes


def test_report_has_every_section_and_its_files(report):
    out, text, _ = report
    for heading in ("## Findings", "## Set-up", "## In-distribution accuracy",
                    "## Accuracy against length", "## Unseen lengths",
                    "## Attention entropy against length", "## Comparison with published results",
                    "## Training", "## Expectations"):  # fmt: skip
        assert heading in text, heading
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert any(link.endswith(".png") for link in links)
    for link in links:
        assert (out / link).exists(), link
    assert "**Question.** Which encoding generalizes?" in text


def test_misfit_arms_are_named_and_expectations_fail_for_them(report):
    _, text, outcomes = report
    assert "Not fitted at the training lengths" in text and "learned on reverse (0.50)" in text
    by_arm = {o.name.split("arm=")[1].rstrip("]"): o.passed for o in outcomes}
    assert by_arm == {"learned": False, "none": True, "rope": True}


def test_unseen_summary_and_reciprocal_rank_by_hand(report):
    out, _, _ = report
    table = pd.read_csv(out / "unseen_lengths.csv")
    none_copy = table[(table.arm == "none") & (table.task == "copy")].iloc[0]
    assert none_copy["mean"] == pytest.approx(0.8 + 0.01)  # seeds add 0, .01, .02
    ranks = pd.read_csv(out / "mean_reciprocal_rank.csv").set_index("arm")
    assert ranks.loc["none", "mrr"] == pytest.approx(1.0)
    assert ranks.loc["rope", "mrr"] == pytest.approx(0.5)
    assert ranks.loc["learned", "mrr"] == pytest.approx(1 / 3)


def test_reference_verdicts_by_hand():
    ours = pd.DataFrame({"arm": ["none", "rope", "learned"] * 2,
                         "task": ["copy"] * 3 + ["reverse"] * 3,
                         "mean": [0.8, 0.4, 0.0, 0.8, 0.4, 0.0],
                         "low": 0.0, "high": 1.0})  # fmt: skip
    ref = Reference(
        source="x",
        values={
            "copy": {"none": 0.9, "rope": 0.1, "learned": 0.0},
            "reverse": {"none": 0.2, "rope": 0.3, "learned": 0.1},
        },
    )
    rows, verdicts = summary.compare(ours, ref)
    assert len(rows) == 6
    v = verdicts.set_index("task")
    assert v.loc["copy", "verdict"] == "agrees" and v.loc["copy", "spearman"] == pytest.approx(1)
    assert v.loc["copy", "pairs_agree"] == v.loc["copy", "pairs_ordered"] == 3
    # reverse: theirs rope > none > learned, ours none > rope > learned: rho = 0.5
    assert v.loc["reverse", "spearman"] == pytest.approx(0.5)
    assert v.loc["reverse", "pairs_agree"] == 2 and v.loc["reverse", "verdict"] == "agrees"
    flat = ours.assign(mean=0.0)
    _, verdicts = summary.compare(flat, ref)
    assert verdicts["verdict"].str.startswith("undecided").all()
    reversed_ = ours.assign(mean=ours["mean"].to_numpy()[::-1])
    _, verdicts = summary.compare(reversed_, ref)
    assert verdicts.set_index("task").loc["copy", "verdict"] == "disagrees"


def test_plain_statement_of_agreement_in_the_report(report):
    _, text, _ = report
    section = text.split("## Comparison with published results")[1]
    assert "copy: agrees with the paper" in section
    assert "NoPE" in section


def test_reciprocal_rank_leaves_out_tasks_no_arm_learns(tmp_path):
    tables = fake_tables()
    ev = tables["eval"]
    addition = ev[ev.task == "copy"].assign(task="addition")
    # nobody learns addition (0.1 at the training lengths); past L, learned is ahead by noise
    past = addition.length > 4
    addition["value"] = 0.1
    addition.loc[past, "value"] = 0.0
    addition.loc[past & (addition.arm == "learned"), "value"] = 0.02
    tables["eval"] = pd.concat([ev, addition], ignore_index=True)
    study = parse_study(tomllib.loads(STUDY), Path("fake.toml"))
    path, _ = write_report(tmp_path, study, tables, MANIFEST)
    ranks = pd.read_csv(tmp_path / "mean_reciprocal_rank.csv").set_index("arm")
    assert "rank addition" not in ranks.columns
    assert ranks.loc["learned", "mrr"] == pytest.approx(1 / 3)  # as without addition
    assert "MRR leaves out addition" in path.read_text()
    exact = summary.metric_rows(tables["eval"], "exact_match")
    seen = summary.by_arm_task(exact[summary.seen(exact)])
    assert summary.fitted_tasks(seen, 0.5) == ["copy", "reverse"]
