"""`probe inspect` and `probe scaling` through the real Typer app, on tiny checkpoints."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from cli_run import exit_code
from probe_cli.main import app
from typer.testing import CliRunner

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.train_config import TrainConfig

runner = CliRunner()


def checkpoint(tmp_path, arch="decoder", pe="learned"):
    torch.manual_seed(0)
    task = TaskConfig(n_symbols=8)
    cfg = ModelConfig(arch=arch, pe=pe, n_layer=2, n_head=2, d_model=16, vocab_size=13)
    return save_checkpoint(tmp_path / f"ckpt-{arch}", Transformer(cfg), task, TrainConfig())


@pytest.mark.parametrize(("arch", "pe"), [("decoder", "learned"), ("encoder-decoder", "t5")])
def test_inspect_writes_tables_and_plots(tmp_path, arch, pe):
    ckpt = checkpoint(tmp_path, arch, pe)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "inspect",
            str(ckpt),
            "--lengths",
            "4,8",
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--batches",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    stats = pd.read_csv(out / "attention_stats.csv")
    assert {"layer", "head", "length", "statistic", "value"} <= set(stats.columns)
    wanted = {"entropy", "normalized_entropy", "max_logit", "p_max", "sink_mass"}
    assert wanted <= set(stats.statistic)
    assert sorted(stats.length.unique()) == [4, 8]
    n_sites = ModelConfig(arch=arch, n_layer=2).n_sites
    assert stats.groupby(["layer", "head"]).ngroups == n_sites * 2
    assert pd.read_parquet(out / "attention_stats.parquet").equals(stats)
    roles = pd.read_csv(out / "roles.csv")
    assert set(roles.statistic) == {"previous_token", "induction", "positional", "sink"}
    for name in ("heatmap_normalized_entropy", "heatmap_max_logit", "entropy_vs_length", "roles"):
        assert (out / f"{name}.png").stat().st_size > 1000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["lengths"] == [4, 8] and manifest["model"]["arch"] == arch
    assert "H/logn" in result.output


def test_inspect_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    ckpt = checkpoint(tmp_path)
    out = str(tmp_path / "out")
    assert exit_code(["inspect", str(ckpt), "--out", out, "--streaming", "maybe"]) == 2
    assert "--streaming must be auto, on or off" in capsys.readouterr().err
    assert exit_code(["inspect", str(ckpt), "--out", out, "--lengths", "8:4"]) == 2
    assert exit_code(["inspect", str(tmp_path / "missing"), "--out", out]) == 2
    # a learned table of 256 positions cannot hold length 200 copy (403 tokens)
    assert exit_code(["inspect", str(ckpt), "--out", out, "--lengths", "200"]) == 2
    assert "learned positional table" in capsys.readouterr().err


def test_inspect_streaming_on_agrees_with_off(tmp_path):
    ckpt = checkpoint(tmp_path, "decoder", "learned")
    tables = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        args = [
            "inspect",
            str(ckpt),
            "--lengths",
            "6",
            "--out",
            str(out),
            "--batch-size",
            "3",
            "--batches",
            "1",
            "--streaming",
            mode,
        ]
        assert runner.invoke(app, args).exit_code == 0
        tables[mode] = pd.read_csv(out / "attention_stats.csv")
    assert (tables["on"].value - tables["off"].value).abs().max() < 1e-5


def test_scaling_without_and_with_training(tmp_path):
    out = tmp_path / "scaling"
    args = [
        "scaling",
        "--out",
        str(out),
        "--steps",
        "0",
        "--d-ks",
        "8,64",
        "--ns",
        "32",
        "--queries",
        "64",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "scaling.csv")
    assert list(table.columns) == ["d_k", "n", "scale", "statistic", "value"]
    var = table[table.statistic == "score_var"].set_index(["d_k", "scale"]).value
    assert var[(64, "none")] == pytest.approx(64, rel=0.3)
    assert var[(64, "sqrt")] == pytest.approx(1, rel=0.3)
    assert (out / "scaling_init.png").exists() and not (out / "scaling_training.csv").exists()

    args = [
        "scaling",
        "--out",
        str(out),
        "--steps",
        "4",
        "--d-k",
        "8",
        "--d-ks",
        "8",
        "--ns",
        "16",
        "--queries",
        "8",
        "--stats-every",
        "2",
        "--train-len",
        "3:4",
        "--device",
        "cpu",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "--overwrite" in str(result.exception)  # the first run's
    result = runner.invoke(app, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    curves = pd.read_csv(out / "scaling_training.csv")
    assert set(curves.scale) == {"sqrt", "none", "inverse"}
    assert {"loss", "entropy", "max_logit"} <= set(curves.statistic)
    assert (out / "scaling_training.png").exists()


def test_scaling_bad_input_exit_2(tmp_path):
    out = str(tmp_path / "s")
    assert exit_code(["scaling", "--out", out, "--d-ks", "8,x"]) == 2
    assert exit_code(["scaling", "--out", out, "--steps", "-1"]) == 2
