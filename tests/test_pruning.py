"""Physical head pruning, plans, the pruning curve and timing."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches
from probe.model import Transformer
from probe.model.positional import alibi_slopes
from probe.pruning.compare import prune_and_compare
from probe.pruning.curves import pruning_curve, score_batches
from probe.pruning.heads import (
    check_heads,
    head_mask,
    masked,
    plan_removal,
    present_heads,
    prune_heads,
    prune_model,
    select_heads,
)
from probe.pruning.timing import time_forward, time_ratios, timing_batches
from probe.train_config import TrainConfig

TASK = TaskConfig(n_symbols=6)


def make_model(arch="decoder", pe="learned", n_head=4, **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch, vocab_size=TASK.vocab_size, n_layer=2, n_head=n_head, d_model=16, pe=pe, **kw
    )
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3)
    return model.eval()


def data(arch="decoder", seed=0):
    return eval_batches(TASK, arch, [3, 5], 6, 1, seed)


def logits(model, batch):
    with torch.no_grad():
        return model(batch.inputs, source=batch.source)


def table(rows):
    return pd.DataFrame(
        [{"layer": a, "head": b, "method": "gradient", "value": v} for a, b, v in rows]
    )


CASES = [
    ("decoder", "alibi", {"scale": "learned"}),
    ("decoder", "rope", {"qk_norm": True}),
    ("encoder", "t5", {}),
    ("decoder", "fire", {}),
    ("encoder", "fire", {"scale": "learned"}),
    ("encoder-decoder", "t5", {"scale": "learned"}),
    ("encoder-decoder", "sinusoidal", {"norm": "post"}),
]


@pytest.mark.parametrize("arch,pe,kw", CASES)
def test_pruned_logits_equal_masked_logits(arch, pe, kw):
    model = make_model(arch, pe, **kw)
    remove = [(0, 1), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]  # layer 1 loses every head
    pruned = prune_heads(model, remove)
    assert pruned.cfg.kept_heads[0] == (0, 2) and pruned.cfg.kept_heads[1] == ()
    for batch in data(arch):
        with masked(model, remove):
            expected = logits(model, batch)
        torch.testing.assert_close(logits(pruned, batch), expected, atol=1e-5, rtol=0)
    assert pruned.parameter_counts()["total"] < model.parameter_counts()["total"]
    assert [g.tolist() for g in model.gates()] == [[1.0] * 4] * len(model.gates())  # untouched


def test_pruned_checkpoint_loads_and_matches(tmp_path):
    model = make_model("decoder", "alibi", scale="learned")
    remove = [(0, 0), (1, 2), (1, 3)]
    pruned = prune_heads(model, remove)
    save_checkpoint(tmp_path / "p", pruned, TASK, TrainConfig(), meta={"note": "pruned"})
    loaded = load_checkpoint(tmp_path / "p")
    assert loaded.model_cfg.kept_heads == ((1, 2, 3), (0, 1))
    batch = data()[0]
    with masked(model, remove):
        expected = logits(model, batch)
    torch.testing.assert_close(logits(loaded.model, batch), expected, atol=1e-5, rtol=0)


def test_a_layer_without_heads_contributes_only_its_output_bias():
    model = make_model()
    pruned = prune_heads(model, [(0, h) for h in range(4)])
    attn = pruned.attention_modules()[0]
    assert attn.n_kept == 0 and attn.q.weight.shape == (0, 16) and attn.o.weight.shape == (16, 0)
    x = torch.randn(2, 5, 16)
    out = attn(x)
    torch.testing.assert_close(out, attn.o.bias.expand(2, 5, 16))


def test_pruning_twice_keeps_original_numbering():
    model = make_model("decoder", "alibi")
    once = prune_heads(model, [(0, 1)])
    twice = prune_heads(once, [(0, 2), (1, 0)])
    assert twice.cfg.kept_heads == ((0, 3), (1, 2, 3))
    first, again = model.attention_modules()[0], twice.attention_modules()[0]
    d = first.d_head
    torch.testing.assert_close(again.q.weight[d:], first.q.weight[3 * d : 4 * d])  # head 3
    torch.testing.assert_close(again.o.weight[:, :d], first.o.weight[:, :d])  # head 0
    torch.testing.assert_close(again.score_bias.slopes, alibi_slopes(4)[[0, 3]])
    assert present_heads(twice) == [(0, 3), (1, 2, 3)]
    with pytest.raises(ProbeError, match=r"Head 1 is not in layer 0.*0, 3"):
        prune_heads(twice, [(0, 1)])
    batch = data()[0]
    with masked(model, [(0, 1), (0, 2), (1, 0)]):
        expected = logits(model, batch)
    torch.testing.assert_close(logits(twice, batch), expected, atol=1e-5, rtol=0)


def test_bad_heads_and_layers_are_clear_errors():
    model = make_model()
    with pytest.raises(ProbeError, match=r"Layer 5 does not exist.*2 attention sites"):
        check_heads(model, [(5, 0)])
    with pytest.raises(ProbeError, match="Head 4 is not in layer 1"):
        head_mask(model, [(1, 4)])
    present = present_heads(model)
    scores = table([(a, b, float(b)) for a in range(2) for b in range(4)])
    with pytest.raises(ProbeError, match=r"Cannot prune 9 heads.*only 8"):
        plan_removal(scores, present, 9)
    with pytest.raises(ProbeError, match="at most 6 can go"):
        plan_removal(scores, present, 7, min_heads_per_layer=1)
    with pytest.raises(ProbeError, match="between 0 and 1"):
        select_heads(model, data(), 1.5, method="random")
    with pytest.raises(ProbeError, match="Layer 0 has 4 heads: removing 4"):
        select_heads(model, data(), 1.0, method="random", scope="layer", min_heads_per_layer=1)


def test_plans_global_layer_and_minimum():
    present = [(0, 1, 2, 3), (0, 1, 2, 3)]
    # layer 0 holds the four least important heads
    scores = table([(0, h, 0.1 * h) for h in range(4)] + [(1, h, 1 + h) for h in range(4)])
    assert plan_removal(scores, present, 4) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert plan_removal(scores, present, 4, min_heads_per_layer=1) == [
        (0, 0), (0, 1), (0, 2), (1, 0)
    ]  # fmt: skip
    assert plan_removal(scores, present, [1, 2]) == [(0, 0), (1, 0), (1, 1)]
    entropy = scores.assign(method="entropy")  # high entropy = least important
    assert plan_removal(entropy, present, 1) == [(1, 3)]


def test_iterative_selection_reestimates_and_restores_gates():
    model = make_model()
    removed = select_heads(model, data(), 0.5, method="gradient", iterative=True, step=0.25)
    assert list(removed["step"]) == [0, 0, 1, 1]
    assert len(set(zip(removed.layer, removed["head"], strict=True))) == 4
    assert all(float(g.min()) == 1.0 for g in model.gates())
    # per-layer quota: each layer gives half its heads
    per_layer = select_heads(model, data(), 0.5, method="random", scope="layer")
    assert per_layer.groupby("layer").size().tolist() == [2, 2]
    result = prune_model(model, data(), 0.25, method="ablation")
    assert sum(len(h) for h in result.model.cfg.kept_heads) == 6


def test_prune_and_compare_reports_equal_masked_and_pruned():
    model = make_model("encoder")
    scoring = data("encoder", seed=7)
    result = prune_and_compare(
        model, data("encoder"), scoring, 0.5, method="gradient", batch_sizes=(1, 4), repeats=1
    )
    wide = result.metrics.pivot(index="metric", columns="variant", values="value")
    assert wide["masked"].to_numpy() == pytest.approx(wide["pruned"].to_numpy(), abs=1e-5)
    assert wide.loc["loss", "original"] == pytest.approx(score_batches(model, scoring)["loss"])
    assert result.max_logit_gap < 1e-5
    assert set(result.timing["variant"]) == {"original", "masked", "pruned"}
    params = result.parameters.pivot(index="part", columns="variant", values="count")
    assert params.loc["attention", "pruned"] < params.loc["attention", "original"]


def test_pruning_curve_table():
    model = make_model()
    splits = [data(seed=1), data(seed=2)]
    curve = pruning_curve(model, splits, data(seed=0), ["gradient", "random"], [0, 0.5, 1.0])
    assert list(curve.columns[:5]) == ["fraction", "method", "seed", "metric", "value"]
    assert sorted(curve["fraction"].unique()) == [0.0, 0.5, 1.0]
    assert set(curve["seed"]) == {0, 1} and set(curve["method"]) == {"gradient", "random"}
    start = curve[(curve.fraction == 0) & (curve.metric == "loss")]["value"]
    assert start.to_numpy() == pytest.approx(score_batches(model, data(seed=0))["loss"])
    # with every head gone all methods agree
    end = curve[(curve.fraction == 1) & (curve.metric == "loss")]["value"]
    assert end.max() - end.min() < 1e-6
    iterative = pruning_curve(model, splits[:1], data(), ["ablation"], [0.25, 0.5], iterative=True)
    assert len(iterative) == 2 * 3 and set(iterative["n_pruned"]) == {2, 4}


def test_timing_table_and_ratios():
    model = make_model()
    pruned = prune_heads(model, [(0, 0), (1, 1)])
    sizes = timing_batches(data()[0], (1, 8))
    assert sizes[8].inputs.shape[0] == 8
    threads = torch.get_num_threads()
    timing = time_forward(
        {"original": model, "pruned": pruned}, sizes, warmup=1, repeats=2, threads=1
    )
    assert torch.get_num_threads() == threads  # restored
    assert len(timing) == 2 * 2 * 2 and (timing["seconds"] >= timing["min_seconds"]).all()
    ratios = time_ratios(timing)
    assert (ratios[ratios.variant == "original"]["ratio"] == 1.0).all()
    with pytest.raises(ProbeError, match="No variant 'masked'"):
        time_ratios(timing, "masked")
