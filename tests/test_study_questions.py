"""The analysis steps and report sections of the paper's-questions studies: position probe,
head roles and head spread, run through a tiny study and checked against hand computations."""

from __future__ import annotations

import tomllib

import numpy as np
import pandas as pd
import pytest
from tiny_study import tiny_study

from probe.report.report import MarkdownReport
from probe.study.grid.report import write_report
from probe.study.grid.spec import parse_study
from probe.study.grid.steps import attention
from probe.study.grid.steps import roles as role_step
from probe.study.runner import run_study

EXTRA = """
[[variant]]
name = "encoder-none"
model = { arch = "encoder", pe = "none" }

[analysis.attention]
lengths = "L"
statistics = ["normalized_entropy"]
batch_size = 4

[analysis.position_probe]
lengths = "L,2L"
batch_size = 16
n_batches = 2

[analysis.roles]
batch_size = 4
period = 4

[[contrast]]
claim = "decoders know position better than a NoPE encoder"
table = "position_probe"
metric = "r2"
where = { depth = ">= 1" }
within = "max"
a = "rope"
b = "encoder-none"
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("questions") / "out"
    study = parse_study(tomllib.loads(tiny_study(steps=4, extra=EXTRA)))
    result = run_study(study, out)
    path, _ = write_report(out, study, result.tables, result.manifest)
    return result.tables, path.read_text(), out


def test_position_probe_table_has_every_depth_and_encoder_gap(run):
    tables, report, _ = run
    probe = tables["position_probe"]
    r2 = probe[probe.statistic == "r2"]
    assert set(r2.depth) == {0, 1}  # embeddings and one block
    assert set(r2.length) == {3, 6}
    gaps = probe[probe.statistic == "permutation_gap"]
    assert set(gaps.arm) == {"encoder-none"}  # decoders are never permutation-equivariant
    assert gaps.value.max() < 1e-4  # no positions: equivariant up to rounding
    assert "## Where is each token?" in report and "permutation_gap.csv" in report


def test_roles_and_spread_sections_are_in_the_report(run):
    tables, report, out = run
    assert set(tables["roles"].statistic) >= {"previous_token", "induction", "positional", "sink"}
    assert "## Head roles" in report and "## How different are the heads?" in report
    assert "decoders know position better than a NoPE encoder" in report
    assert (out / "position_probe.png").is_file() and (out / "roles.png").is_file()


def test_head_spread_and_role_shares_by_hand(tmp_path):
    rows, roles = [], []
    values = {0: [0.1, 0.5, 0.9, 0.3], 1: [0.4, 0.4, 0.6, 0.2]}
    for seed, vals in values.items():
        for i, v in enumerate(vals):
            cell = f"c{seed}"
            rows.append({"cell": cell, "arm": "4", "seed": seed, "layer": i // 2, "head": i % 2,
                         "statistic": "normalized_entropy", "value": v})  # fmt: skip
            for role, score in (("sink", v), ("induction", 1 - v)):
                roles.append({"cell": cell, "arm": "4", "seed": seed, "layer": i // 2,
                              "head": i % 2, "statistic": role, "value": score})  # fmt: skip
    rep = MarkdownReport(tmp_path, "t")
    [spread] = attention.head_spread(rep, pd.DataFrame(rows), ["4"])
    expected = np.mean([np.std(v) for v in values.values()])
    assert f"4 {expected:.2f}" in spread
    [share] = role_step.section(rep, pd.DataFrame(roles), ["4"])
    # a role when sink >= 0.5 or induction >= 0.5: seed 0 all 4 heads (0.1 -> 0.9 induction,
    # 0.3 -> 0.7), seed 1 all 4 (0.4 -> 0.6 induction, 0.2 -> 0.8); every head has a role
    assert "4 100%" in share
    roles_df = pd.DataFrame(roles)
    weaker = (roles_df.seed == 1) & (roles_df.statistic == "induction") & (roles_df.value == 0.6)
    roles_df.loc[weaker, "value"] = 0.45
    [share] = role_step.section(rep, roles_df, ["4"])
    # seed 1's heads 0 and 1 (sink 0.4, induction 0.6 -> 0.45) lose their role: 2 of 4 keep
    # one (head 2 by its sink score 0.6); mean over seeds (1 + 0.5) / 2
    assert "4 75%" in share


def test_attention_cost_study_reports_slopes_and_an_answer(tmp_path):
    """One cell, the attention_cost step: explicit attention keeps the n x n scores, so its
    measured peak memory quadruples when n doubles (slope 2); SDPA's does not."""
    text = tiny_study(steps=1, pes=("none",)).replace("[0, 1]", "[0]")
    text += (
        '\n[analysis.attention_cost]\nns = [64, 128, 256, 512]\nmethods = ["explicit", "sdpa"]'
        "\nrepeats = 1\n"
    )
    study = parse_study(tomllib.loads(text))
    result = run_study(study, tmp_path / "out")
    path, _ = write_report(tmp_path / "out", study, result.tables, result.manifest)
    slopes = pd.read_csv(tmp_path / "out" / "attention_cost_slopes.csv").set_index(["method", "y"])
    assert slopes.loc[("explicit", "peak_bytes"), "slope"] == pytest.approx(2.0, abs=0.2)
    assert slopes.loc[("sdpa", "peak_bytes"), "slope"] < 1.5
    report = path.read_text()
    assert "**Answer.** From n = 128 to 512, peak memory grows as explicit n^" in report
    assert "## Training" not in report  # one step: no curve to draw


def test_importance_iterative_pruning_and_timing_steps(tmp_path):
    """The heads study's steps on a tiny model: every estimator's table, iterative curves
    labelled apart from one-shot ones, and the physically pruned model timed with exactly the
    removed heads' parameters gone (4 d_model d_head weights + 3 d_head biases per head)."""
    text = (
        tiny_study(steps=4, pes=("rope",))
        .replace("[0, 1]", "[0]")
        .replace("n_head = 2", "n_head = 4")
    )
    text += """
[analysis.importance]
methods = ["gradient", "ablation", "entropy"]
batch_size = 8
n_batches = 1

[analysis.prune]
fractions = [0.25, 0.5]
methods = ["gradient", "random"]
iterative = ["gradient"]
batch_size = 8
n_batches = 1

[analysis.prune_timing]
fractions = [0.5]
batch_sizes = [1]
repeats = 2
batch_size = 8
n_batches = 1
"""
    study = parse_study(tomllib.loads(text))
    result = run_study(study, tmp_path / "out")
    path, _ = write_report(tmp_path / "out", study, result.tables, result.manifest)
    importance = result.tables["importance"]
    assert set(importance.method) == {"gradient", "ablation", "entropy"}
    assert len(importance) == 3 * 4  # one row per head and estimator
    pruning = result.tables["pruning"]
    iterative = pruning[pruning.method == "gradient iterative"]
    assert set(iterative.fraction) == {0.25, 0.5}
    timing = result.tables["prune_timing"]
    d_model, d_head = 16, 4
    per_head = 4 * d_model * d_head + 3 * d_head
    row = timing.iloc[0]
    assert row.n_pruned == 2
    assert row.original_params - row.params == row.n_pruned * per_head
    report = path.read_text()
    for heading in ("## Do the importance estimators agree?", "## Speed of the physically pruned"):
        assert heading in report
