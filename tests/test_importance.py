"""Head importance estimators, each checked against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches
from probe.model import Transformer
from probe.pruning.heads import masked, prune_heads
from probe.pruning.importance import (
    compare_estimators,
    disjoint_splits,
    example_keys,
    head_importance,
    importance_correlations,
    parse_methods,
    without,
)

TASK = TaskConfig(n_symbols=6)


def make_model(arch="decoder", pe="learned", seed=0, double=False, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        arch=arch, vocab_size=TASK.vocab_size, n_layer=2, n_head=3, d_model=12, pe=pe, **kw
    )
    model = Transformer(cfg)
    with torch.no_grad():  # larger weights than the init, so heads differ clearly
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.4)
    return (model.double() if double else model).eval()


def batches(arch="decoder", seed=0, size=6):
    return eval_batches(TASK, arch, [2, 4], size, 1, seed)


def example_losses(model, batch) -> torch.Tensor:
    """Per-example answer cross-entropy in float64, written independently of
    probe.measure.evaluate."""
    logits = model(batch.inputs, source=batch.source).double()  # [batch, seq, vocab]
    token = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
    mask = batch.loss_mask.double()
    return (token * mask).sum(1) / mask.sum(1)  # [batch]


@pytest.mark.parametrize(
    "arch,pe", [("decoder", "alibi"), ("encoder", "t5"), ("encoder-decoder", "rope")]
)
def test_gradient_equals_finite_difference(arch, pe):
    model = make_model(arch, pe, double=True, scale="learned")
    data = batches(arch)
    table = head_importance(model, data, "gradient")
    eps = 1e-5
    expected = []
    for m in model.attention_modules():
        for i, _ in enumerate(m.kept_heads):
            total, n = 0.0, 0
            for b in data:
                with torch.no_grad():
                    m.gate[i] = 1 + eps
                    up = example_losses(model, b)
                    m.gate[i] = 1 - eps
                    down = example_losses(model, b)
                    m.gate[i] = 1.0
                total += ((up - down) / (2 * eps)).abs().sum().item()  # |.| per example
                n += len(up)
            expected.append(total / n)
    np.testing.assert_allclose(table["value"].to_numpy(), expected, rtol=1e-5, atol=1e-8)


def test_gradient_takes_abs_per_example_and_keeps_no_state():
    model = make_model(double=True)
    data = batches()
    first = head_importance(model, data, "gradient")["value"].to_numpy()
    again = head_importance(model, data, "gradient")["value"].to_numpy()
    np.testing.assert_array_equal(first, again)  # nothing accumulates between calls or batches
    assert all(p.grad is None for p in model.parameters())
    assert not any(g.requires_grad for g in model.gates())
    # |mean of gradients| (the old bertology bug) is smaller than the mean of |gradients|
    gates = model.gates()
    for g in gates:
        g.requires_grad_(True)
    loss = sum(example_losses(model, b).sum() for b in data) / sum(len(b.inputs) for b in data)
    summed = torch.cat(torch.autograd.grad(loss, gates)).abs().numpy()
    assert np.all(first >= summed - 1e-12) and np.any(first > summed + 1e-6)


def test_gradient_with_frozen_weights():
    model = make_model()
    for p in model.parameters():
        p.requires_grad_(False)
    table = head_importance(model, batches(), "gradient")
    assert len(table) == 6 and (table["value"] > 0).all()


def test_ablation_is_the_loss_increase():
    model = make_model(double=True)
    data = batches()
    table = head_importance(model, data, "ablation")

    def mean_loss():
        with torch.no_grad():
            losses = torch.cat([example_losses(model, b) for b in data])
        return losses.mean().item()

    base = mean_loss()
    for row in table.itertuples():
        with masked(model, [(row.layer, row.head)]):
            assert row.value == pytest.approx(mean_loss() - base, abs=1e-6)


def test_mean_ablation_equals_moving_the_mean_into_the_output_bias():
    model = make_model(double=True)
    data = batches()
    table = head_importance(model, data, "mean-ablation").set_index(["layer", "head"])["value"]
    attn = model.attention_modules()[1]
    d = attn.d_head
    outputs = []

    class Keep:
        needs_weights = False

        def record(self, call):
            if call.layer == 1:
                outputs.append(call.head_out[:, 0].reshape(-1, d))  # head 0: [batch*q, d]

    with torch.no_grad(), model.observe(Keep()):
        base = torch.cat([example_losses(model, b) for b in data]).mean().item()
    mean = torch.cat(outputs).mean(0)  # [d_head]
    with torch.no_grad():
        old_bias = attn.o.bias.clone()
        attn.o.bias += attn.o.weight[:, :d] @ mean  # W_O's columns of head 0 times the mean
        with masked(model, [(1, 0)]):
            ablated = torch.cat([example_losses(model, b) for b in data]).mean().item()
        attn.o.bias.copy_(old_bias)
    assert table[(1, 0)] == pytest.approx(ablated - base, abs=1e-6)


def test_confidence_and_entropy_from_explicit_weights():
    model = make_model("encoder-decoder")
    data = batches("encoder-decoder")
    sums: dict[int, list] = {}

    class Weights:
        needs_weights = True

        def record(self, call):
            p = call.probs.double()  # [batch, head, q, k]
            ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [batch, head, q]
            old = sums.get(call.layer, [0, 0, 0])
            sums[call.layer] = [
                old[0] + p.amax(-1).sum((0, 2)),
                old[1] + ent.sum((0, 2)),
                old[2] + p.shape[0] * p.shape[2],
            ]

    with torch.no_grad(), model.observe(Weights()):
        for b in data:
            model(b.inputs, source=b.source)
    conf = head_importance(model, data, "confidence")
    ent = head_importance(model, data, "entropy")
    for layer, (p_max, entropy, rows) in sums.items():
        got_c = conf[conf.layer == layer]["value"].to_numpy()
        got_e = ent[ent.layer == layer]["value"].to_numpy()
        np.testing.assert_allclose(got_c, (p_max / rows).numpy(), rtol=1e-4)
        np.testing.assert_allclose(got_e, (entropy / rows).numpy(), rtol=1e-4)


def test_random_is_seeded_and_masked_heads_get_no_row():
    model = make_model()
    a = head_importance(model, batches(), "random", seed=3)
    b = head_importance(model, batches(), "random", seed=3)
    c = head_importance(model, batches(), "random", seed=4)
    assert a.equals(b) and not a.equals(c)
    with masked(model, [(0, 1), (1, 2)]):
        table = head_importance(model, batches(), "gradient")
    assert set(zip(table.layer, table["head"], strict=True)) == {(0, 0), (0, 2), (1, 0), (1, 1)}


def test_per_layer_normalization():
    table = head_importance(make_model(), batches(), "gradient", normalize=True)
    norms = table.groupby("layer")["value"].apply(lambda v: math.sqrt((v**2).sum()))
    np.testing.assert_allclose(norms.to_numpy(), 1.0)


def test_correlations_match_scipy():
    rng = np.random.default_rng(0)
    rows = []
    values = {m: rng.normal(size=6) for m in ("gradient", "entropy", "random")}
    for m, v in values.items():
        rows += [{"layer": i // 3, "head": i % 3, "method": m, "value": x} for i, x in enumerate(v)]
    corr = importance_correlations(pd.DataFrame(rows)).set_index(["method", "other"])["rho"]
    assert corr[("gradient", "gradient")] == pytest.approx(1.0)
    assert corr[("gradient", "random")] == pytest.approx(
        spearmanr(values["gradient"], values["random"])[0]
    )
    # entropy counts as importance when negated: low entropy = important
    assert corr[("gradient", "entropy")] == pytest.approx(
        spearmanr(values["gradient"], -values["entropy"])[0]
    )
    assert corr[("random", "gradient")] == corr[("gradient", "random")]


def test_compare_estimators_and_method_names():
    table, corr = compare_estimators(make_model(), batches(), "gradient,random")
    assert list(table["method"].unique()) == ["gradient", "random"]
    assert len(corr) == 4
    assert parse_methods("all")[0] == "gradient"
    with pytest.raises(ProbeError, match="Did you mean 'gradient'"):
        parse_methods("gradiant")


def test_importance_and_evaluation_splits_share_no_example():
    small = TaskConfig(n_symbols=2)  # length 2: only 4 distinct prompts, overlap is certain
    splits, scoring = disjoint_splits(
        small, "decoder", [2, 5], batch_size=16, n_batches=2, seed=0, n_importance=3
    )
    held_out = {k for b in scoring for k in example_keys(b)}
    for split in splits:
        keys = {k for b in split for k in example_keys(b)}
        assert keys and not keys & held_out
    raw = eval_batches(small, "decoder", [2], 16, 1, 1)
    assert {k for b in raw for k in example_keys(b)} & held_out  # the filter did the work
    with pytest.raises(ProbeError, match="also occurs in the evaluation split"):
        disjoint_splits(small, "decoder", [1], batch_size=64, n_batches=1, seed=0)


def test_without_keeps_encoder_decoder_sources_aligned():
    data = batches("encoder-decoder", size=8)
    kept = without(data, [data[0]])
    assert all(len(b.inputs) == len(b.source) == len(b.targets) for b in kept)
    assert not {k for b in kept for k in example_keys(b)} & set(example_keys(data[0]))


@pytest.mark.parametrize(
    "method", ["gradient", "ablation", "mean-ablation", "confidence", "entropy"]
)
def test_every_estimator_runs_on_a_model_with_an_empty_site(method):

    model = prune_heads(make_model("encoder-decoder"), [(1, 0), (1, 1), (1, 2), (3, 1)])
    table = head_importance(model, batches("encoder-decoder"), method)
    assert 1 not in set(table["layer"]) and len(table) == 3 * 6 - 4
    assert table["value"].notna().all()
