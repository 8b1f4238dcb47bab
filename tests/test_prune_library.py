"""`probe.pruning.run`: a Python caller gets what `probe prune` gets, on the same checkpoint and
options (the same heads removed, metrics, pruned weights and records), and the policies the
command used to decide alone (the random baseline, imported models' defaults, the timing
budget, pruning in place) are the library's."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import test_cli_prune
import torch
from cli_run import exit_code
from test_cli_prune import SMALL, TASK

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches
from probe.pruning import run
from probe.pruning.heads import masked

checkpoint = test_cli_prune.checkpoint  # the same tiny checkpoint (a module fixture)
DATA = run.Data(lengths=(3, 4), batch_size=8)  # the same data as test_cli_prune.SMALL


def test_prune_in_python_is_probe_prune(checkpoint, tmp_path):
    cli = tmp_path / "cli"
    args = ["prune", str(checkpoint), "--fraction", "0.5", "--method", "ablation", "--no-timing"]
    assert exit_code([*args, "--out", str(cli), *SMALL]) == 0
    result = run.prune(load_checkpoint(checkpoint), 0.5, method="ablation", data=DATA,
                       timing=None)  # fmt: skip
    found = result.comparison
    columns = ["layer", "head"]
    removed = pd.read_csv(cli / "removed_heads.csv")[columns]
    assert removed.values.tolist() == found.removed[columns].values.tolist()
    pd.testing.assert_frame_equal(pd.read_csv(cli / "prune_metrics.csv"), found.metrics,
                                  check_exact=False, rtol=1e-12)  # fmt: skip
    record = load_checkpoint(cli).meta["pruning"][-1]
    assert json.loads(json.dumps(result.record)) == record

    out = result.save(tmp_path / "py")
    for name in ("removed_heads.csv", "prune_metrics.csv"):
        assert (out / name).read_text() == (cli / name).read_text()
    assert not (out / "prune_timing.csv").exists()  # not timed, as --no-timing writes none
    ours, theirs = load_checkpoint(out), load_checkpoint(cli)
    assert ours.meta == theirs.meta and ours.meta["origin"] == "test"
    for name, tensor in theirs.model.state_dict().items():
        assert torch.equal(ours.model.state_dict()[name], tensor), name

    # independently: the pruned model computes what the original does with those heads masked
    original = load_checkpoint(checkpoint).model
    heads = [tuple(h) for h in record["removed"]]
    batch = eval_batches(TASK, "decoder", [4], 5, 1, 9)[0]
    with torch.no_grad(), masked(original, heads):
        expected = original(batch.inputs)
    with torch.no_grad():
        torch.testing.assert_close(found.model(batch.inputs), expected, atol=1e-5, rtol=0)


def test_sweep_in_python_is_probe_prune_sweep(checkpoint, tmp_path):
    cli = tmp_path / "sweep"
    args = ["prune", str(checkpoint), "--sweep", "--methods", "gradient", "--seeds", "2"]
    assert exit_code([*args, "--fractions", "0,0.5,1", "--out", str(cli), *SMALL]) == 0
    result = run.sweep(load_checkpoint(checkpoint), "gradient", seeds=2, fractions=[0, 0.5, 1],
                       data=DATA)  # fmt: skip
    assert result.methods == ["gradient", "random"]  # the random baseline, added as by the CLI
    assert set(result.curve["method"]) == {"gradient", "random"}
    pd.testing.assert_frame_equal(pd.read_csv(cli / "pruning.csv"), result.curve,
                                  check_exact=False, rtol=1e-12, check_dtype=False)  # fmt: skip
    manifest = json.loads((cli / "manifest.json").read_text())
    assert manifest["settings"] == json.loads(json.dumps(result.settings))
    assert result.metric == "exact_match"  # a task model is read by exact match


def test_the_policies_are_the_librarys(checkpoint):
    assert run.with_baseline(["gradient"]) == ["gradient", "random"]
    assert run.with_baseline(["random", "ablation"]) == ["random", "ablation"]
    assert run.sweep_methods("fisher+tune, gradient") == ["gradient", "fisher+tune"]
    plain, counted = run.Timing(), run.Timing(repeats=5)
    assert (plain.repeats_for(True), plain.sizes_for(True)) == (3, [1, 8])  # imported
    assert (plain.repeats_for(False), plain.sizes_for(False)) == (10, [1, 16, 64])
    assert plain.budget_share == run.TIMING_SHARE and counted.budget_share is None
    assert run.Timing(budget=2.0).budget_share is None
    ckpt = load_checkpoint(checkpoint)
    assert run.in_place_for(ckpt, tune=False) is None  # a trained model: when no copy fits
    assert run.in_place_for(ckpt, tune=True) is False
    assert run.task_lengths(ckpt) == [3, 4]  # the lengths it was trained on


@pytest.mark.parametrize(
    "options,message",
    [
        ({"method": "gradiant"}, "Did you mean 'gradient'"),
        ({"method": "all"}, "by one importance method"),
        ({"tune": True, "unit": "group"}, "--tune works with --unit head"),
        ({"scope": "everywhere"}, "Unknown pruning scope"),
    ],
)
def test_bad_options_are_refused_before_any_work(options, message):
    with pytest.raises(ProbeError, match=message):
        run.check_options(**{"method": "gradient", "scope": "global", "unit": "head", **options})
