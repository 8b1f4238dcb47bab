"""One meaning per table and per word: the one schema of the roles and curve tables (and the
reader that takes older tables into it), the one definition of "a head has role R", and the one
place that says which metric a model is scored by."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probe.analysis.roles import DOMINANT, ROLE_THRESHOLDS, ROLES, has_role
from probe.data.tasks import Batch
from probe.pruning.objectives import PRIMARY, TASK, objective_of, primary
from probe.schema import CURVE_COLUMNS, ROLE_COLUMNS, normalise, normalise_all

REFERENCES = Path(__file__).resolve().parents[1] / "probe" / "references.toml"

ROWS = [(0, "blocks.0.attn", 0, "previous_token", 0.9, -1.0),
        (0, "blocks.0.attn", 0, "sink", 0.05, np.nan),
        (1, "blocks.1.attn", 1, "induction", 0.31, np.nan)]  # fmt: skip


def test_old_and_new_role_columns_read_as_the_same_frame():
    new = pd.DataFrame(ROWS, columns=ROLE_COLUMNS)
    old = pd.DataFrame(ROWS, columns=["layer", "site", "head", "role", "score", "offset"])
    pd.testing.assert_frame_equal(normalise("roles", old), new)
    pd.testing.assert_frame_equal(normalise("roles", new), new)  # already in the schema
    retrieval = old.assign(prompts=3, score_teacher_forced=0.5)  # context columns kept
    got = normalise("retrieval", retrieval)
    assert list(got.columns) == [*ROLE_COLUMNS, "prompts", "score_teacher_forced"]
    assert got["value"].tolist() == [0.9, 0.05, 0.31]


def test_curves_without_a_unit_were_pruned_by_head():
    rows = [(0.0, "gradient", 0, "loss", 2.0, 0), (0.5, "gradient", 0, "loss", 2.5, 2)]
    new = pd.DataFrame([(*r, "head") for r in rows], columns=CURVE_COLUMNS)
    old = pd.DataFrame(rows, columns=CURVE_COLUMNS[:-1])
    pd.testing.assert_frame_equal(normalise("curves", old), new)
    # a grid cell's table: split for the importance split, its identity and n_heads around it
    cell = old.rename(columns={"seed": "split"}).assign(n_heads=4)
    got = normalise("pruning", cell)
    assert list(got.columns) == ["fraction", "method", "split", "metric", "value", "n_pruned",
                                 "unit", "n_heads"]  # fmt: skip
    assert set(got.unit) == {"head"}
    # a table of another kind is left alone, whatever its columns
    assert normalise("knockout", old) is old


def test_the_study_readers_take_an_old_results_directory(tmp_path):
    from probe.study.heads.plan import read_head_tables
    from probe.study.runner import load_tables

    old = pd.DataFrame(ROWS, columns=["layer", "site", "head", "role", "score", "offset"])
    for name in ("old", "new"):
        (tmp_path / name / "tables").mkdir(parents=True)
    old.to_csv(tmp_path / "old" / "tables" / "roles.csv", index=False)
    normalise("roles", old).to_csv(tmp_path / "new" / "tables" / "roles.csv", index=False)
    for read in (read_head_tables, load_tables):
        a, b = read(tmp_path / "old"), read(tmp_path / "new")
        pd.testing.assert_frame_equal(a["roles"], b["roles"])
        assert list(a["roles"].columns) == ROLE_COLUMNS
    assert normalise_all({"roles": old})["roles"].columns.tolist() == ROLE_COLUMNS


def test_the_committed_head_study_tables_are_in_the_one_schema():
    root = Path(__file__).resolve().parents[1] / "results"
    for path in sorted(root.glob("*/tables/roles.csv")):
        columns = pd.read_csv(path, nrows=0).columns.tolist()
        assert columns[-len(ROLE_COLUMNS) :] == ROLE_COLUMNS, path


def test_the_retrieval_threshold_is_wu_et_al_s_and_strict():
    refs = tomllib.loads(REFERENCES.read_text(encoding="utf-8"))
    wu = [v for v in refs["wu2024"]["values"] if "threshold" in v["what"]]
    assert ROLE_THRESHOLDS["retrieval"].value == wu[0]["value"] == 0.1
    scores = pd.Series([0.1, 0.1000001, 0.5])
    assert has_role("retrieval", scores).tolist() == [False, True, True]  # "larger than 0.1"


def test_probe_s_own_thresholds_are_reached_and_every_threshold_has_a_source():
    assert has_role("induction", pd.Series([0.29, 0.3, 0.31])).tolist() == [False, True, True]
    assert has_role("sink", pd.Series([0.49, 0.5])).tolist() == [False, True]
    for role, t in ROLE_THRESHOLDS.items():
        assert role in (*ROLES, "retrieval") and 0 < t.value < 1 and t.source, role
    # the grid reports' uniform bar is a different question: it differs where a paper-free
    # threshold was chosen lower (induction)
    assert DOMINANT == 0.5 and ROLE_THRESHOLDS["induction"].value < DOMINANT


def test_role_counts_use_the_one_definition():
    from probe.study.heads import evidence as ev

    rng = np.random.default_rng(0)
    rows = [(layer, "s", head, role, float(rng.random()), np.nan)
            for layer in range(3) for head in range(4) for role in ROLE_THRESHOLDS]  # fmt: skip
    roles = pd.DataFrame(rows, columns=ROLE_COLUMNS)
    counts = ev.role_counts(roles, n_heads=12).set_index("role")
    for role, t in ROLE_THRESHOLDS.items():  # counted by hand
        scores = [r[4] for r in rows if r[3] == role]
        want = sum(s > t.value if t.strict else s >= t.value for s in scores)
        assert counts.loc[role, "heads"] == want and counts.loc[role, "threshold"] == t.value


def test_primary_metric_per_objective():
    from probe.pruning.curves import primary_metric, score_batches

    assert primary(None) == PRIMARY[TASK] == ("exact_match", True)
    assert primary("embedding") == ("similarity", True)
    assert primary("causal-lm") == primary("masked-lm") == ("loss", False)
    for objective in ("embedding", "causal-lm", "masked-lm"):
        batch = Batch(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
                      torch.ones(1, 2, dtype=torch.bool), None, 2, objective=objective)  # fmt: skip
        assert primary_metric([batch]) == primary(objective).metric
    # a task model's scores carry its primary metric (computed by the scoring itself)
    from probe.config import ModelConfig
    from probe.data.tasks import TaskConfig
    from probe.measure.evaluate import eval_batches
    from probe.model import Transformer

    model = Transformer(ModelConfig(n_layer=1, n_head=2, d_model=16, vocab_size=21))
    batches = eval_batches(TaskConfig(), "decoder", [4], 2, 1, 0)
    assert primary_metric(batches) in score_batches(model, batches)


@pytest.mark.parametrize(
    ("metrics", "objective"),
    [({"similarity", "neighbours"}, "embedding"), ({"loss", "perplexity"}, "causal-lm"),
     ({"exact_match", "token_accuracy", "loss"}, TASK)],
)  # fmt: skip
def test_the_objective_of_a_curve_table_is_the_one_its_primary_metric_names(metrics, objective):
    assert objective_of(metrics) == objective
    assert primary(objective).metric in metrics
