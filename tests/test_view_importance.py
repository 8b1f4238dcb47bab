"""The importance `probe view` colours heads by is `probe importance`'s on the same data: both
commands run through the real CLI with the same options, the page's numbers (read back from
its inlined data) against importance.csv. A sentence encoder scored against no reference (every
ablation exactly 0) or a viewer scoring other rows than `probe importance` fails here."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.train_config import TrainConfig

TASK = TaskConfig(name="copy", n_symbols=6)


def page_data(path) -> dict:
    html = path.read_text()
    found = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', html,
                      re.S)  # fmt: skip
    assert found, "the page inlines its data"
    return json.loads(found.group(1))


def page_importance(path, method: str) -> pd.Series:
    data = page_data(path)
    values = data["statistics"][f"importance_{method}"]["values"]
    return pd.Series({(layer, head): v for layer, row in enumerate(values)
                      for head, v in enumerate(row) if v is not None})  # fmt: skip


def cli_importance(out, method: str) -> pd.Series:
    table = pd.read_csv(out / "importance.csv")
    part = table[table["method"] == method]
    return pd.Series(dict(zip(zip(part["layer"], part["head"], strict=True), part["value"],
                              strict=True)))  # fmt: skip


def compare(page: pd.Series, cli: pd.Series) -> None:
    assert sorted(page.index) == sorted(cli.index)
    got, want = page[cli.index].to_numpy(float), cli.to_numpy(float)
    assert np.abs(want).max() > 0, "probe importance scored every head 0"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # the page keeps 5 decimals


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=3, d_model=24, pe="learned",
                      max_len=32)  # fmt: skip
    path = tmp_path_factory.mktemp("trained") / "ckpt"
    save_checkpoint(path, Transformer(cfg), TASK, TrainConfig(steps=1, train_len=(2, 5)))
    return path


def test_view_of_a_trained_model_colours_by_probe_importance(trained, tmp_path):
    page, out = tmp_path / "v.html", tmp_path / "imp"
    common = ["--batch-size", "8", "--batches", "2", "--seed", "3", "--importance", "gradient"]
    assert exit_code(["view", str(trained), "--out", str(page), "--length", "4,5", *common]) == 0
    common[-2] = "--method"
    assert exit_code(["importance", str(trained), "--out", str(out), "--lengths", "4,5",
                      *common]) == 0  # fmt: skip
    compare(page_importance(page, "gradient"), cli_importance(out, "gradient"))


def test_view_of_a_sentence_encoder_colours_by_probe_importance(tmp_path):
    pytest.importorskip("transformers")
    from test_cli_imported import hf_dir

    ckpt = tmp_path / "encoder"
    assert exit_code(["import", str(hf_dir("bert", tmp_path)), "--out", str(ckpt)]) == 0
    page, out = tmp_path / "v.html", tmp_path / "imp"
    common = ["--batch-size", "4", "--batches", "1", "--seed", "1", "--importance", "ablation"]
    assert exit_code(["view", str(ckpt), "--out", str(page), "--length", "16", *common]) == 0
    common[-2] = "--method"
    assert exit_code(["importance", str(ckpt), "--out", str(out), "--max-tokens", "16",
                      *common]) == 0  # fmt: skip
    compare(page_importance(page, "ablation"), cli_importance(out, "ablation"))
