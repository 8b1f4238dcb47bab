"""Sliding-window attention inside probe: the mask follows transformers' convention (a query at i
sees keys j with i - w < j <= i), the fused and explicit paths agree, observers normalise by the
keys a row can see, streaming equals the full matrix, and configs check, save and load windows."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from probe import load_checkpoint
from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.observe import AttentionStats
from probe.measure.streaming import STATISTICS, row_statistics
from probe.model import AttentionCall, Transformer
from probe.model.mask import visible, visible_counts
from probe.pruning.heads import masked, prune_heads
from probe.site import Site
from probe.train_config import TrainConfig


def hand_visible(q_len: int, k_len: int, w: int | None) -> torch.Tensor:
    """[q, k] by the definition, one entry at a time: the queries are the last q_len keys."""
    out = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        p = k_len - q_len + i
        for j in range(k_len):
            out[i, j] = j <= p and (w is None or p - j < w)
    return out


def site(window=None, causal=True) -> Site:
    return Site("blocks.0.attn", 0, False, causal, 2, 2, (0, 1), window)


@pytest.mark.parametrize(("q_len", "k_len", "w"), [(9, 9, 3), (9, 9, 1), (4, 9, 3), (9, 9, 20)])
def test_mask_is_the_definition(q_len, k_len, w):
    got = visible(site(w), q_len, k_len)
    assert torch.equal(got.view(q_len, k_len), hand_visible(q_len, k_len, w))
    assert torch.equal(visible_counts(site(w), q_len, k_len), got.sum(-1).view(-1).float())


def test_mask_matches_transformers_function():
    """transformers' own sliding_window_causal_mask_function, evaluated index by index."""
    masking = pytest.importorskip("transformers.masking_utils")
    for w in (1, 3, 8):
        fn = masking.sliding_window_causal_mask_function(w)
        i, j, zero = torch.arange(12).view(-1, 1), torch.arange(12).view(1, -1), torch.tensor(0)
        want = fn(zero, zero, i, j)  # [q, k] bool
        assert torch.equal(visible(site(w), 12, 12).view(12, 12), want)


def test_site_refuses_a_window_it_cannot_have():
    with pytest.raises(ProbeError, match="causal self-attention"):
        site(4, causal=False)
    with pytest.raises(ProbeError, match="causal self-attention"):
        site(0)


def tiny(window=4, layers=None, **kw) -> Transformer:
    torch.manual_seed(0)
    kw = {"n_layer": 2, "n_head": 4, "d_model": 32, "vocab_size": 21, "max_len": 64, **kw}
    cfg = ModelConfig(sliding_window=window, window_layers=layers, **kw)
    return Transformer(cfg).eval()


class Weights:
    """Keeps every attention matrix (the explicit path)."""

    needs_weights = True

    def __init__(self):
        self.calls = []

    def record(self, call):
        self.calls.append((call.layer, call.probs.double().clone()))


def observed(model, tokens, observer, **kw):
    with torch.no_grad(), model.observe(observer):
        return model(tokens, **kw)


@pytest.mark.parametrize("pe", ["rope", "alibi", "learned"])
def test_explicit_and_fused_paths_agree_and_the_window_is_in_the_weights(pe):
    model = tiny(window=3, layers=(1,), pe=pe, n_kv_head=2)
    tokens = torch.randint(0, 21, (2, 14))
    key_mask = torch.ones(2, 14, dtype=torch.bool)
    key_mask[1, 10:] = False
    weights = Weights()
    for kw in ({}, {"key_mask": key_mask}):
        with torch.no_grad():
            fused = model(tokens, **kw)
        explicit = observed(model, tokens, weights, **kw)
        stats = observed(model, tokens, AttentionStats(["entropy"], streaming=False), **kw)
        assert (explicit - fused).abs().max() < 1e-5
        assert (stats - fused).abs().max() < 1e-5
    # layer 0 sees every earlier key, layer 1 only the last 3
    for layer, probs in weights.calls[:2]:
        seen = probs[0, 0] > 0  # [q, k]
        assert torch.equal(seen, hand_visible(14, 14, 3 if layer == 1 else None))
    # the window changes the function: a model without it computes something else
    with torch.no_grad():
        cfg = dataclasses.replace(model.cfg, sliding_window=None, window_layers=None)
        unwindowed = Transformer(cfg).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert (unwindowed(tokens) - model(tokens)).abs().max() > 1e-4


def test_observed_entropy_is_normalised_by_the_keys_a_row_sees():
    w, n = 4, 13
    model = tiny(window=w)
    tokens = torch.randint(0, 21, (3, n))
    weights = Weights()
    observed(model, tokens, weights)
    names = ["entropy", "normalized_entropy", "uniform_entropy"]
    for streaming in (False, True):
        stats = AttentionStats(names, streaming=streaming, tile=3)
        observed(model, tokens, stats)
        table = stats.table().set_index(["layer", "head", "statistic"])["value"]
        for layer, probs in weights.calls:
            plogp = torch.where(probs > 0, probs * probs.log(), 0.0)
            entropy = -plogp.sum(-1)  # [batch, head, q]
            seen = torch.tensor([min(i + 1, w) for i in range(n)], dtype=torch.float64)
            several = seen > 1  # a row with one key has no normalised entropy
            normalized = (entropy / seen.log())[..., several]
            for head in range(4):
                got = [table[(layer, head, s)] for s in names]
                want = [entropy[:, head].mean(), normalized[:, head].mean(), seen.log().mean()]
                assert got == pytest.approx([float(x) for x in want], abs=1e-5)


def window_call(seed: int, w: int, n: int = 40, q_len: int | None = None) -> AttentionCall:
    g = torch.Generator().manual_seed(seed)
    b, h, d = 2, 3, 16
    q_len = q_len or n
    q, k, v = (torch.randn(b, h, m, d, generator=g) for m in (q_len, n, n))
    seen = hand_visible(q_len, n, w).view(1, 1, q_len, n)
    where = Site("blocks.0.attn", 0, False, True, h, h, tuple(range(h)), w)
    return AttentionCall(where, q, k, v, torch.full((h,), 0.5), None, None, seen)


def full_matrix(call: AttentionCall) -> dict[str, torch.Tensor]:
    """The softmax statistics straight from the [b, h, q, k] matrix, in float64."""
    _, logits = call.logits()
    logits = logits.double()
    p = logits.softmax(-1)
    entropy = -torch.where(p > 0, p * p.log(), 0.0).sum(-1)
    n = call.visible.sum(-1).double()
    q_len, k_len = p.shape[-2:]
    i = torch.arange(k_len - q_len, k_len).double().view(-1, 1)
    j = torch.arange(k_len).double().view(1, -1)
    return {
        "entropy": entropy,
        "normalized_entropy": torch.where(n > 1, entropy / n.log(), float("nan")),
        "p_max": p.amax(-1),
        "sink_mass": p[..., 0],
        "attention_distance": (p * (i - j).abs()).sum(-1),
        "log_sum_exp": logits.logsumexp(-1),
        "uniform_entropy": n.log().expand_as(entropy),
    }


@pytest.mark.parametrize(("w", "q_len"), [(1, None), (5, None), (8, 11)])
@pytest.mark.parametrize("tile", [1, 4, 7, None])
def test_streaming_equals_the_full_matrix_with_a_window(w, q_len, tile):
    call = window_call(w + (tile or 0), w, q_len=q_len)
    want = full_matrix(call)
    names = [s for s in STATISTICS if s != "head_out_norm"]
    streamed = row_statistics(call, names, tile=tile, stream=True)
    whole = row_statistics(call, names, stream=False)
    for name in names:
        torch.testing.assert_close(streamed[name], whole[name], atol=1e-5, rtol=1e-5,
                                   equal_nan=True)  # fmt: skip
    for name, value in want.items():
        torch.testing.assert_close(streamed[name].double(), value, atol=1e-5, rtol=1e-5,
                                   equal_nan=True)  # fmt: skip
    assert float(streamed["attention_distance"].max()) <= w - 1 + 1e-6  # no key past the window


def test_log_length_factor_counts_the_window():
    model = tiny(window=4, log_scale_len=8)
    calls = []

    class Keep:
        needs_weights = False

        def record(self, call):
            calls.append(call.length_factor.clone())

    observed(model, torch.randint(0, 21, (1, 10)), Keep())
    want = torch.tensor([math.log(min(i + 1, 4)) / math.log(8) for i in range(10)])
    torch.testing.assert_close(calls[0], want)


def test_pruning_keeps_the_window():
    model = tiny(window=3, layers=(0,))
    tokens = torch.randint(0, 21, (2, 12))
    with torch.no_grad(), masked(model, [(0, 1), (1, 2)]):
        want = model(tokens)
    pruned = prune_heads(model, [(0, 1), (1, 2)])
    assert [s.window for s in pruned.cfg.sites()] == [3, None]
    with torch.no_grad():
        assert (pruned(tokens) - want).abs().max() < 1e-5


def test_config_checks_the_window():
    with pytest.raises(ProbeError, match="sliding_window must be at least 1"):
        ModelConfig(sliding_window=0)
    with pytest.raises(ProbeError, match="needs arch 'decoder'"):
        ModelConfig(arch="encoder", sliding_window=4)
    with pytest.raises(ProbeError, match=r"distinct layers in 0\.\.1"):
        ModelConfig(n_layer=2, sliding_window=4, window_layers=(2,))
    with pytest.raises(ProbeError, match="window_layers is set but sliding_window is not"):
        ModelConfig(window_layers=(0,))
    with pytest.raises(ProbeError, match="distinct"):
        ModelConfig(sliding_window=4, window_layers=())
    with pytest.raises(ProbeError, match="sliding_window"):
        ModelConfig.from_dict({"sliding_window": "8"})
    assert ModelConfig(n_layer=3, sliding_window=2, window_layers=[2, 0]).window_layers == (0, 2)


def test_a_windowed_checkpoint_round_trips_and_old_ones_load_without_a_window(tmp_path):
    model = tiny(window=3, layers=(1,), pe="rope")
    path = save_checkpoint(tmp_path / "ckpt", model, TaskConfig(), TrainConfig())
    ckpt = load_checkpoint(path)
    assert ckpt.model_cfg == model.cfg
    assert (ckpt.model_cfg.sliding_window, ckpt.model_cfg.window_layers) == (3, (1,))
    tokens = torch.randint(0, 21, (2, 12))
    with torch.no_grad():
        assert torch.equal(ckpt.model(tokens), model(tokens))
    old = {k: v for k, v in model.cfg.to_dict().items() if k not in ("sliding_window",
                                                                    "window_layers")}  # fmt: skip
    cfg = ModelConfig.from_dict(old)
    assert cfg.sliding_window is None and all(s.window is None for s in cfg.sites())
