"""`probe train`, `probe eval`, `probe info` through the real entry point."""

import json

import pandas as pd
import pytest
from cli_run import exit_code
from probe_cli.main import app, main
from typer.testing import CliRunner


def run(args, capsys):
    """Run the `probe` entry point; returns (exit code, stdout, stderr)."""
    code = exit_code(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "copy"
    result = CliRunner().invoke(
        app,
        ["train", "--task", "copy", "--train-len", "2:5", "--steps", "30", "--seed", "0",
         "--d-model", "32", "--eval-every", "15", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_train_writes_a_checkpoint(checkpoint):
    assert (checkpoint / "model.safetensors").exists()
    doc = json.loads((checkpoint / "config.json").read_text())
    assert doc["train"]["steps"] == 30 and doc["task"]["name"] == "copy"
    assert "torch" in doc["meta"]["versions"]
    metrics = pd.read_csv(checkpoint / "metrics.csv")
    assert {"step", "split", "metric", "value"} <= set(metrics.columns)
    assert sorted(metrics.query("split == 'eval'").step.unique()) == [15, 30]


def test_eval_covers_lengths_inside_and_outside_training(checkpoint, tmp_path, capsys):
    code, out, _ = run(
        ["eval", str(checkpoint), "--lengths", "1:8", "--out", str(tmp_path)], capsys
    )
    assert code == 0
    table = pd.read_csv(tmp_path / "eval.csv")
    assert {"length", "metric", "value", "n"} <= set(table.columns)
    assert sorted(table.length.unique()) == list(range(1, 9))
    assert {"exact_match", "token_accuracy"} <= set(table.metric)
    assert "unseen" in out and "trained" in out


def test_info_shows_config_and_parameters(checkpoint, capsys):
    code, out, _ = run(["info", str(checkpoint)], capsys)
    assert code == 0
    assert "d_model" in out and "attention" in out and "total" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--task", "cpoy", "--out", "x"], "Did you mean 'copy'"),
        (["train", "--pe", "alibii", "--out", "x"], "Did you mean 'alibi'"),
        (["train", "--train-len", "9:3", "--out", "x"], "lengths"),
        (["eval", "/nonexistent/ckpt", "--out", "x"], "does not exist"),
        (["info", "/nonexistent/ckpt"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, _, err = run(args, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_learned_positions_beyond_the_table_are_refused(checkpoint, tmp_path, capsys):
    code, _, err = run(
        ["eval", str(checkpoint), "--lengths", "200", "--out", str(tmp_path)], capsys
    )
    assert code == 2 and "learned positional table" in err


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(Exception, match="does not exist"):
        main(["info", "/nonexistent/ckpt", "--debug"])
