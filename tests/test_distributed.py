"""DistributedDataParallel on the CPU (gloo): two processes under torchrun train the same
weights as one process splitting each global batch the same way (`train(..., shards=2)`), and
only rank 0 writes a checkpoint."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from probe.checkpoint import load_checkpoint
from probe.data.tasks import TaskConfig
from probe.training.distributed import World, global_batch, rank_rows, shard_generators
from probe.training.train import train

TOLERANCE = 1e-4  # largest absolute weight difference allowed after 30 steps (float32 sums)
ARGS = ["--task", "copy", "--n-symbols", "8", "--train-len", "2:6", "--steps", "30",
        "--batch-size", "16", "--layers", "1", "--heads", "2", "--d-model", "32",
        "--eval-every", "0", "--device", "cpu"]  # fmt: skip


def test_shards_split_the_global_batch_and_one_shard_is_the_single_stream():
    task = TaskConfig(name="copy", n_symbols=8)
    one = global_batch(
        task, "decoder", 4, 8, shard_generators(0, 1, torch.Generator().manual_seed(0))
    )
    two = global_batch(
        task, "decoder", 4, 8, shard_generators(0, 2, torch.Generator().manual_seed(0))
    )
    assert torch.equal(one.inputs[:4], two.inputs[:4])  # shard 0 = the run's own stream
    assert not torch.equal(one.inputs[4:], two.inputs[4:])  # shard 1 has its own generator
    halves = [rank_rows(two, World(r, 2)).inputs for r in (0, 1)]
    assert torch.equal(torch.cat(halves), two.inputs)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--random-positions", "--max-len", "24"]],
                         ids=["plain", "random-positions"])  # fmt: skip
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path, extra):
    """Randomized positions too: drawn for the global batch, each rank takes its rows' share."""
    out = tmp_path / "ddp"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "probe",  # as the README launches it by hand
        "train",
        *ARGS,
        *extra,
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "metrics.csv",
        "model.safetensors",
    ]  # rank 0 only
    assert list(tmp_path.iterdir()) == [out]
    ckpt = load_checkpoint(out, "cpu")
    ddp = ckpt.model.state_dict()
    one = train(ckpt.model_cfg, ckpt.task, ckpt.train_cfg, shards=2).model.state_dict()
    plain = train(ckpt.model_cfg, ckpt.task, ckpt.train_cfg, shards=1).model.state_dict()
    diffs = {k: (ddp[k] - one[k]).abs().max().item() for k in one}
    assert max(diffs.values()) < TOLERANCE, max(diffs.items(), key=lambda kv: kv[1])
    # the comparison can fail: a different split of the data gives different weights
    assert max((plain[k] - one[k]).abs().max().item() for k in one) > 100 * TOLERANCE


@pytest.mark.slow
def test_importance_runs_data_parallel_with_the_same_scores(tmp_path):
    """Gradient importance in 2 gloo processes (each scores every other batch, the per-head sums
    are added) equals one process over all the batches."""
    import pandas as pd
    from cli_run import exit_code

    ckpt = tmp_path / "ckpt"
    assert exit_code(["train", *ARGS, "--out", str(ckpt)]) == 0
    common = [
        "importance",
        str(ckpt),
        "--method",
        "gradient",
        "--batches",
        "4",
        "--batch-size",
        "8",
    ]
    assert exit_code([*common, "--out", str(tmp_path / "one")]) == 0
    command = [sys.executable, "-m", "probe_cli.main", *common, "--nproc", "2",
               "--out", str(tmp_path / "two")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    one = pd.read_csv(tmp_path / "one" / "importance.csv")
    two = pd.read_csv(tmp_path / "two" / "importance.csv")
    pd.testing.assert_frame_equal(one, two, rtol=1e-9)
    assert one["value"].abs().max() > 0  # a real score, not all zeros
    assert exit_code([*common, "--method", "ablation", "--nproc", "2",
                      "--out", str(tmp_path / "x")]) == 2  # fmt: skip
