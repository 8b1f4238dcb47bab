"""The report: sections from hand-made tables, ranks and the published comparison checked by
hand, files beside report.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from probe.study.grid.report import write_report
from probe.study.grid.spec import parse_study

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
id = "kazemnejad2023"
metric = "exact_match"
lengths = "unseen"
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
    # learned: third on copy, not fitted on reverse (0.5 at the training lengths): no rank there
    assert ranks.loc["learned", "mrr"] == pytest.approx((1 / 3 + 0) / 2)
    assert pd.isna(ranks.loc["learned", "rank reverse"])


def test_the_comparison_cites_the_paper_and_has_too_few_arms(report):
    _, text, _ = report
    section = text.split("## Comparison with published results")[1].split("\n## ")[0]
    assert "Kazemnejad" in section and "arXiv:2305.19466" in section
    assert "REFERENCES" not in text and "shared/" not in text
    # only NoPE and Rotary of the paper's encodings are here: no verdict on any scope
    assert "copy too few to compare (2 fitted encodings)" in section
    assert "across tasks too few to compare" in section
    assert "NoPE's mean reciprocal rank" in section  # the quoted value, with its source
    # the plain sentence: none is first on both tasks among the arms fitting both (none, rope)
    assert "none generalizes best to unseen lengths among the 2 arms" in section
    assert "first on 2 of 2 tasks" in section and "as in the paper" in section


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
    assert "rank addition" not in ranks.columns  # no arm fits it: not ranked at all
    assert ranks.loc["learned", "mrr"] == pytest.approx(1 / 6)  # as without addition
    assert "tasks no arm fits are not ranked" in path.read_text()


def test_scaling_at_init_and_attention_during_training(tmp_path):
    """A grid over model.scale with the init_scaling step: the init table keeps its own scale
    column (not the grid factor's), its score variance is d_k x factor^2 (the formula), and the
    attention statistics logged in training get their figure."""
    from tiny_study import tiny_study

    from probe.study.runner import run_study

    text = tiny_study(steps=4).replace(
        'model.pe = ["learned", "rope"]', 'model.scale = ["sqrt", "none"]'
    )
    text = text.replace("eval_every = 0", "eval_every = 0\nstats_every = 2")
    text += "\n[analysis.init_scaling]\nd_ks = [16, 64]\nns = [128]\nn_queries = 256\n"
    study = parse_study(tomllib.loads(text))
    result = run_study(study, tmp_path / "out")
    path, _ = write_report(tmp_path / "out", study, result.tables, result.manifest)
    init = pd.read_csv(tmp_path / "out" / "init_scaling.csv")
    assert set(init.scale) == {"sqrt", "none", "inverse"}
    var = init[init.statistic == "score_var"].set_index(["d_k", "scale"]).value
    for d_k in (16, 64):
        for scale, factor in (("sqrt", d_k**-0.5), ("none", 1.0), ("inverse", 1 / d_k)):
            assert var[(d_k, scale)] == pytest.approx(d_k * factor**2, rel=0.15)
    report = path.read_text()
    assert "## At initialization: why sqrt(d_k)" in report
    assert "attention_during_training.png" in report
    assert (tmp_path / "out" / "attention_during_training.png").is_file()


def test_length_curves_name_sweep_arms_and_variants_in_the_legend():
    """A study's [[variant]] arms are dashed and the legend says so (not "encoding", which
    was wrong for any study whose sweep is not over encodings)."""
    from probe.report.study_plots import length_curves

    rows = [
        {"arm": arm, "variant": variant, "task": "copy", "seed": seed, "length": n, "L": 4,
         "value": 1.0 / n}
        for arm, variant in (("sqrt", ""), ("qk-norm", "qk-norm"))
        for seed in (0, 1) for n in (2, 4, 8)
    ]  # fmt: skip
    fig = length_curves(pd.DataFrame(rows), "exact match")
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert {"sqrt", "qk-norm", "from the sweep", "a [[variant]]"} <= set(texts)
    assert "encoding" not in texts
    data = [line for line in fig.axes[0].get_lines() if len(line.get_xdata()) == 3]  # lengths
    assert len(data) == 2
    assert {line.get_linestyle() for line in data} == {
        "-",
        "--",
    }  # the sweep solid, the variant dashed
