"""Every command that runs a model, on a bf16 and an fp16 checkpoint, on the CPU: in the
checkpoint's own dtype by default and in float32 with --dtype float32. Manifests record the dtype
the model ran in, and the numbers are those of the float32 run within what half precision costs
(`precision.bound`, relative to each value; argmax-based metrics such as accuracy are not
continuous in the logits and are left out)."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch
from cli_run import exit_code
from precision import HALF, bound

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.runtime import dtype_name
from probe.train_config import TrainConfig

TASK = TaskConfig(n_symbols=6)
SMALL = ["--batch-size", "8", "--lengths", "3,4"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A Llama-shaped model (rotary, RMSNorm, SwiGLU, grouped-query attention) saved in bf16
    and in fp16, weights far from the tiny init so attention is far from uniform."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                      pe="rope", norm_type="rms", ffn="swiglu", bias=False)  # fmt: skip
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
    root = tmp_path_factory.mktemp("half")
    half = {dtype: copy.deepcopy(model).to(dtype) for dtype in HALF}
    train = TrainConfig(train_len=(3, 4))
    return {d: save_checkpoint(root / dtype_name(d), m, TASK, train) for d, m in half.items()}


def both(args: list[str], out) -> tuple:
    """Run `probe ARGS --out OUT-own` and `... --out OUT-32 --dtype float32`."""
    own, wide = out.parent / f"{out.name}-own", out.parent / f"{out.name}-32"
    assert exit_code([*args, "--out", str(own)]) == 0
    assert exit_code([*args, "--out", str(wide), "--dtype", "float32"]) == 0
    return own, wide


def runtime_dtype(out) -> str:
    return json.loads((out / "manifest.json").read_text())["runtime"]["dtype"]


def assert_close(half: pd.DataFrame, full: pd.DataFrame, keys: list[str], dtype, column="value"):
    merged = half.merge(full, on=keys, suffixes=("", "_32"))
    assert len(merged) == len(half) == len(full)
    tol = (1 + merged[f"{column}_32"].abs()) * bound(dtype, 1)
    assert ((merged[column] - merged[f"{column}_32"]).abs() <= tol).all(), merged


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_eval_importance_and_prune_run_in_the_checkpoints_dtype(checkpoints, dtype, tmp_path):
    ckpt, name = checkpoints[dtype], dtype_name(dtype)
    own, wide = both(["eval", str(ckpt), *SMALL], tmp_path / "eval")
    assert (runtime_dtype(own), runtime_dtype(wide)) == (name, "float32")
    half, full = pd.read_csv(own / "eval.csv"), pd.read_csv(wide / "eval.csv")
    loss = ["length", "metric"]
    assert_close(half[half.metric == "loss"], full[full.metric == "loss"], loss, dtype)

    own, wide = both(["importance", str(ckpt), "--method", "gradient,fisher", *SMALL],
                     tmp_path / "importance")  # fmt: skip
    assert (runtime_dtype(own), runtime_dtype(wide)) == (name, "float32")
    half, full = pd.read_csv(own / "importance.csv"), pd.read_csv(wide / "importance.csv")
    assert_close(half, full, ["layer", "head", "method"], dtype)

    own, wide = both(["prune", str(ckpt), "--fraction", "0.25", "--no-timing", *SMALL],
                     tmp_path / "pruned")  # fmt: skip
    for out, want in ((own, dtype), (wide, torch.float32)):
        pruned = load_checkpoint(out)
        assert json.loads((out / "config.json").read_text())["dtype"] == dtype_name(want)
        assert {p.dtype for p in pruned.model.parameters()} == {want}
        assert pruned.meta["pruning"][-1]["runtime"]["dtype"] == dtype_name(want)
        assert len(pd.read_csv(out / "removed_heads.csv")) == 2  # a quarter of 8 heads
    half, full = pd.read_csv(own / "prune_metrics.csv"), pd.read_csv(wide / "prune_metrics.csv")
    keys = [c for c in half.columns if c != "value"]
    losses = half[half.metric == "loss"], full[full.metric == "loss"]
    gone = [set(map(tuple, pd.read_csv(o / "removed_heads.csv")[["layer", "head"]].values))
            for o in (own, wide)]  # fmt: skip
    if gone[0] == gone[1]:  # the same heads went (near-ties may rank otherwise in half precision)
        assert_close(*losses, keys, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_inspect_sweep_and_view_run_in_the_checkpoints_dtype(checkpoints, dtype, tmp_path):
    ckpt, name = checkpoints[dtype], dtype_name(dtype)
    own, wide = both(["inspect", str(ckpt), "--lengths", "3,4", "--batch-size", "8",
                      "--batches", "1"], tmp_path / "inspect")  # fmt: skip
    assert (runtime_dtype(own), runtime_dtype(wide)) == (name, "float32")
    half = pd.read_csv(own / "attention_stats.csv")
    full = pd.read_csv(wide / "attention_stats.csv")
    smooth = ~half.statistic.str.startswith("p_max_gt")  # row counts: not continuous
    keys = ["length", "layer", "head", "statistic"]
    assert_close(half[smooth], full[~full.statistic.str.startswith("p_max_gt")], keys, dtype)
    roles_half, roles_full = pd.read_csv(own / "roles.csv"), pd.read_csv(wide / "roles.csv")
    assert_close(roles_half, roles_full, ["layer", "head", "statistic"], dtype, column="value")

    own, wide = both(["prune", str(ckpt), "--sweep", "--fractions", "0,0.5", "--seeds", "1",
                      "--methods", "gradient,random", *SMALL], tmp_path / "sweep")  # fmt: skip
    assert (runtime_dtype(own), runtime_dtype(wide)) == (name, "float32")
    half, full = pd.read_csv(own / "pruning.csv"), pd.read_csv(wide / "pruning.csv")
    keys = ["fraction", "method", "seed", "metric"]
    at = (half.metric == "loss") & ((half.fraction == 0) | (half.method == "random"))
    at_full = (full.metric == "loss") & ((full.fraction == 0) | (full.method == "random"))
    assert_close(half[at], full[at_full], keys, dtype)  # the same heads: nothing to rank

    for flag in ([], ["--dtype", "float32"]):
        page = tmp_path / f"view{len(flag)}.html"
        assert exit_code(["view", str(ckpt), "--out", str(page), *flag]) == 0
        assert page.stat().st_size > 10_000
