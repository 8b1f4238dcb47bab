"""Named points (`Transformer.intervene`): the values they carry against hand computations from
the weights, a replacement at `heads` against the gate that removes a head, nothing attached
after the block (exception or not), and one-line errors for unknown or doubly taken points."""

from __future__ import annotations

import math

import pytest
import torch

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.model import Transformer

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])


def decoder(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=12, n_layer=2, n_head=3, d_model=24, pe="none", **kw)
    return Transformer(cfg).eval()


def hand_heads(attn, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v per head, times its gate, concatenated
    ([batch, seq, head * d_head]), with loops over heads from the weight matrices."""
    t, d = x.shape[1], attn.d_head
    outs = []
    for h in range(attn.n_kept):
        rows = slice(h * d, (h + 1) * d)
        q = x @ attn.q.weight[rows].T + attn.q.bias[rows]  # [b, t, d]
        k = x @ attn.k.weight[rows].T + attn.k.bias[rows]
        v = x @ attn.v.weight[rows].T + attn.v.bias[rows]
        scores = q @ k.transpose(1, 2) / math.sqrt(d)  # [b, t, t]
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -math.inf)
        outs.append(torch.softmax(scores, -1) @ v * attn.gate[h])
    return torch.cat(outs, -1)


def unattached(model: Transformer) -> bool:
    return all(getattr(m, "points", None) is None for m in model.modules())


@torch.no_grad()
def test_point_values_match_the_hand_computation():
    model = decoder()
    seen = {}

    def keep(name):
        return lambda value: seen.__setitem__(name, value)

    names = ["resid_pre", "heads", "out", "update"]
    taps = {f"blocks.0.attn.{n}": keep(n) for n in names}
    taps |= {"blocks.0.resid_post": keep("post0"), "blocks.1.attn.resid_pre": keep("pre1")}
    with model.intervene(taps):
        model.features(TOKENS)
    x = seen["resid_pre"]  # pre-LN: the attention reads norm(x)
    embedded = model.embed(TOKENS)  # pe none: the stream starts as the embeddings
    torch.testing.assert_close(x, embedded)
    heads = hand_heads(model.blocks[0].attn, model.blocks[0].ln_attn(x))
    torch.testing.assert_close(seen["heads"], heads, atol=1e-5, rtol=1e-4)
    o = model.blocks[0].attn.o
    torch.testing.assert_close(seen["out"], heads @ o.weight.T + o.bias, atol=1e-5, rtol=1e-4)
    assert torch.equal(seen["update"], seen["out"])  # no output norm in pre-LN
    assert torch.equal(seen["post0"], seen["pre1"])  # a block's output is the next one's input
    assert unattached(model)


@torch.no_grad()
def test_a_head_replaced_by_zeros_is_the_head_gated_off():
    model = decoder()
    d = model.cfg.d_head

    def zero_head_1(merged):
        merged = merged.clone()  # [batch, seq, head * d_head]
        merged[..., d : 2 * d] = 0
        return merged

    with model.intervene({"blocks.1.attn.heads": zero_head_1}):
        replaced = model(TOKENS)
    model.blocks[1].attn.gate[1] = 0.0
    torch.testing.assert_close(replaced, model(TOKENS), atol=0, rtol=0)


@torch.no_grad()
def test_cross_attention_adds_to_the_stream_after_self_attention():
    torch.manual_seed(0)
    cfg = ModelConfig(arch="encoder-decoder", vocab_size=12, n_layer=1, n_head=2, d_model=16)
    model = Transformer(cfg).eval()
    seen = {}
    names = ["blocks.0.attn.resid_pre", "blocks.0.attn.update", "blocks.0.cross.resid_pre",
             "encoder.0.attn.heads"]  # fmt: skip
    with model.intervene({n: lambda v, n=n: seen.__setitem__(n, v) for n in names}):
        model(TOKENS, source=TOKENS)
    after_self = seen["blocks.0.attn.resid_pre"] + seen["blocks.0.attn.update"]
    if cfg.norm_before:
        torch.testing.assert_close(seen["blocks.0.cross.resid_pre"], after_self)
    else:  # post-LN: the sum is normed
        ln = model.blocks[0].ln_attn
        torch.testing.assert_close(seen["blocks.0.cross.resid_pre"], ln(after_self))
    assert seen["encoder.0.attn.heads"].shape == (2, 7, 16)


@torch.no_grad()
def test_the_args_point_replays_the_call():
    model = decoder()
    calls, outs = [], []
    with model.intervene({"blocks.1.attn.args": calls.append, "blocks.1.attn.out": outs.append}):
        model(TOKENS)
    attn = model.blocks[1].attn
    assert torch.equal(attn(**calls[0]), outs[0])


def test_nothing_stays_attached_after_the_block_even_on_an_exception():
    model = decoder()

    def fail(value):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), model.intervene({"blocks.0.attn.heads": fail}):
        model(TOKENS)
    assert unattached(model)
    with model.intervene({"blocks.1.resid_post": lambda v: None}):
        assert model.blocks[1].points is not None
    assert unattached(model)


def test_unknown_and_doubly_taken_points_are_one_line():
    model = decoder()
    with pytest.raises(ProbeError, match=r"Did you mean 'blocks\.0\.attn\.heads'") as err:
        model.intervene({"blocks.0.atn.heads": print})
    assert "\n" not in str(err.value) and "blocks.N.attn.heads" in str(err.value)
    both = {"blocks.0.attn.heads": print, "blocks.0.attn.out": print}
    with model.intervene({"blocks.0.attn.out": print}):
        taken = pytest.raises(RuntimeError, match=r"already attached at 'blocks\.0\.attn\.out'")
        with taken, model.intervene(both):
            pass
        assert set(model.blocks[0].attn.points) == {"out"}  # the half attached was taken back
    assert unattached(model)
