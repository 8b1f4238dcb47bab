"""`probe importance` and `probe prune` through the real CLI entry point."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.measure.evaluate import eval_batches
from probe.model import Transformer
from probe.pruning.heads import masked
from probe.train_config import TrainConfig

TASK = TaskConfig(n_symbols=6)
SMALL = ["--batch-size", "8", "--lengths", "3,4"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=4, d_model=16, pe="alibi")
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3)
    path = tmp_path_factory.mktemp("ckpt") / "model"
    save_checkpoint(path, model, TASK, TrainConfig(train_len=(3, 4)), meta={"origin": "test"})
    return path


def test_importance_writes_table_heatmap_and_correlations(checkpoint, tmp_path):
    out = tmp_path / "imp"
    code = exit_code(
        ["importance", str(checkpoint), "--method", "gradient,entropy", "--out", str(out)]
    )
    assert code == 0
    table = pd.read_csv(out / "importance.csv")
    assert list(table.columns) == ["layer", "head", "method", "value"]
    assert len(table) == 2 * 2 * 4
    assert (out / "importance.png").stat().st_size > 0
    assert (out / "correlations.png").exists() and (out / "correlations.csv").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["lengths"] == [3, 4]  # the training lengths by default


def test_prune_writes_a_smaller_checkpoint_that_matches_the_masked_model(checkpoint, tmp_path):
    out = tmp_path / "pruned"
    args = ["prune", str(checkpoint), "--fraction", "0.5", "--method", "ablation"]
    fast = ["--repeats", "1", "--timing-sizes", "1,4"]
    assert exit_code([*args, "--out", str(out), *SMALL, *fast]) == 0
    pruned = load_checkpoint(out)
    original = load_checkpoint(checkpoint)
    removed = pd.read_csv(out / "removed_heads.csv")
    assert len(removed) == 4 and sum(len(h) for h in pruned.model_cfg.kept_heads) == 4
    record = pruned.meta["pruning"][-1]
    assert pruned.meta["origin"] == "test" and record["method"] == "ablation"
    heads = [tuple(x) for x in record["removed"]]
    batch = eval_batches(TASK, "decoder", [4], 5, 1, 9)[0]
    with torch.no_grad(), masked(original.model, heads):
        expected = original.model(batch.inputs)
    with torch.no_grad():
        got = pruned.model(batch.inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    timing = pd.read_csv(out / "prune_timing.csv")
    assert set(timing["batch_size"]) == {1, 4}

    # pruning the pruned checkpoint keeps the original head ids
    again = tmp_path / "again"
    args = ["prune", str(out), "--fraction", "0.5", "--method", "random", "--no-timing"]
    assert exit_code([*args, "--out", str(again), *SMALL]) == 0
    twice = load_checkpoint(again)
    for before, after in zip(pruned.model_cfg.kept_heads, twice.model_cfg.kept_heads, strict=True):
        assert set(after) <= set(before)
    assert sum(len(h) for h in twice.model_cfg.kept_heads) == 2
    assert len(twice.meta["pruning"]) == 2


def test_prune_sweep_writes_curve_and_plot(checkpoint, tmp_path):
    out = tmp_path / "sweep"
    args = ["prune", str(checkpoint), "--sweep", "--methods", "gradient", "--seeds", "2"]
    assert exit_code([*args, "--fractions", "0,0.5,1", "--out", str(out), *SMALL]) == 0
    curve = pd.read_csv(out / "pruning.csv")
    assert list(curve.columns[:5]) == ["fraction", "method", "seed", "metric", "value"]
    assert set(curve["method"]) == {"gradient", "random"}  # the random baseline is added
    assert set(curve["seed"]) == {0, 1}
    assert (out / "pruning.png").stat().st_size > 0


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--fraction", "2"], "between 0 and 1"),
        (["--method", "gradiant"], "Did you mean 'gradient'"),
        (["--min-heads-per-layer", "3"], "at most 2 can go"),
        (["--scope", "everywhere"], "Unknown pruning scope"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(checkpoint, tmp_path, capsys, extra, message):
    args = ["prune", str(checkpoint), "--out", str(tmp_path / "x"), "--no-timing", *SMALL]
    assert exit_code([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err.replace("\n", " ")
    assert "Traceback" not in err


def test_missing_checkpoint_is_exit_code_2(tmp_path, capsys):
    assert exit_code(["importance", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
