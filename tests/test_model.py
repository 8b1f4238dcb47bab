"""The model against independent computations: the textbook formula, the paper's table,
Press et al.'s slopes, and structural properties (equivariance, causality, relative position)."""

import math

import pytest
import torch

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.model import Transformer
from probe.model.positional import alibi_slopes, sinusoidal_table


class WantWeights:
    needs_weights = True

    def record(self, call) -> None:
        pass


def textbook_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k) + causal mask) V per head, concatenated, times W_O, computed
    from the module's weight matrices with plain loops over heads."""
    t = x.shape[1]
    d = attn.d_head
    wq, wk, wv = attn.q.weight, attn.k.weight, attn.v.weight  # [h*d, d_model]
    outs = []
    for h in range(attn.n_kept):
        rows = slice(h * d, (h + 1) * d)
        q = x @ wq[rows].T + attn.q.bias[rows]  # [b, t, d]
        k = x @ wk[rows].T + attn.k.bias[rows]
        v = x @ wv[rows].T + attn.v.bias[rows]
        scores = q @ k.transpose(1, 2) / math.sqrt(d)  # [b, t, t]
        if attn.causal:
            future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            scores = scores.masked_fill(future, float("-inf"))
        outs.append(torch.softmax(scores, -1) @ v * attn.gate[h])
    return torch.cat(outs, -1) @ attn.o.weight.T + attn.o.bias


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("observed", [False, True])
def test_attention_matches_textbook_formula(arch, observed):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, pe="none", n_head=3, d_model=24)
    attn = Transformer(cfg).attention_modules()[0]
    for p in attn.parameters():  # non-trivial biases and scales
        torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():
        attn.gate.copy_(torch.tensor([1.0, 0.5, -2.0]))
    x = torch.randn(2, 7, 24)
    if observed:
        attn.observer = WantWeights()
    got = attn(x)
    attn.observer = None
    torch.testing.assert_close(got, textbook_attention(attn, x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pe", ["sinusoidal", "learned", "none", "rope", "alibi", "t5", "fire"])
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_fused_and_explicit_paths_agree(pe, arch):
    torch.manual_seed(1)
    cfg = ModelConfig(arch=arch, pe=pe, n_head=4, d_model=32, scale="learned", qk_norm=True,
                      log_scale_len=6)  # fmt: skip
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 32, (3, 9))
    source = torch.randint(0, 32, (3, 5)) if arch == "encoder-decoder" else None
    fused = model(tokens, source)
    with model.observe(WantWeights()):
        explicit = model(tokens, source)
    assert (fused - explicit).abs().max() < 1e-5


def test_encoder_without_positions_is_permutation_equivariant():
    torch.manual_seed(2)
    model = Transformer(ModelConfig(arch="encoder", pe="none", n_head=4, d_model=32)).eval()
    tokens = torch.randint(0, 32, (2, 10))
    perm = torch.randperm(10)
    out = model(tokens)
    out_perm = model(tokens[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)


def test_rope_scores_depend_only_on_offset():
    torch.manual_seed(3)
    cfg = ModelConfig(pe="rope", n_head=2, d_model=32, rope_fraction=0.5)
    rotary = Transformer(cfg).attention_modules()[0].rotary
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i: int, j: int) -> float:
        qi = rotary(q, torch.tensor([[i]]))
        kj = rotary(k, torch.tensor([[j]]))
        return float((qi * kj).sum())

    for offset in (0, 1, 5):
        values = [score(i + offset, i) for i in (0, 3, 17, 40)]
        assert max(values) - min(values) < 1e-4
    assert abs(score(5, 0) - score(9, 0)) > 1e-3  # and it does depend on the offset
    # the unrotated half is untouched
    torch.testing.assert_close(rotary(q, torch.tensor([[7]]))[..., 8:], q[..., 8:])


def test_alibi_slopes():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # non power of two (Press et al.): the 4-head slopes, then every other slope of 8 heads
    expected6 = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert torch.allclose(alibi_slopes(6), torch.tensor(expected6))


def test_alibi_bias_is_distance_penalty():
    cfg = ModelConfig(pe="alibi", n_head=8, d_model=32)
    bias_mod = Transformer(cfg).attention_modules()[0].score_bias
    pos = torch.arange(5).unsqueeze(0)
    bias = bias_mod.bias(pos, pos)  # [1, 8, 5, 5]
    assert bias[0, 0, 4, 1] == pytest.approx(-0.5 * 3)
    assert bias[0, 7, 3, 3] == 0


def test_sinusoidal_table_matches_formula():
    d = 16
    table = sinusoidal_table(torch.arange(50), d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("pe", ["learned", "rope", "alibi", "t5", "fire", "none"])
def test_causal_mask_blocks_the_future(pe):
    torch.manual_seed(4)
    model = Transformer(ModelConfig(pe=pe, n_head=2, d_model=16)).eval()
    tokens = torch.randint(0, 32, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 32
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-4


def test_zero_gate_removes_exactly_that_head():
    torch.manual_seed(5)
    cfg = ModelConfig(n_head=4, d_model=32, pe="alibi")
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 32, (2, 9))
    model.attention_modules()[1].gate.data[2] = 0.0
    gated = model(tokens)
    # independent: the same weights with head 2 of site 1 zeroed in W_O's columns
    attn = model.attention_modules()[1]
    attn.gate.data[2] = 1.0
    with torch.no_grad():
        attn.o.weight[:, 2 * 8 : 3 * 8] = 0.0
    torch.testing.assert_close(gated, model(tokens), atol=1e-6, rtol=1e-6)


def test_pruned_config_builds_zero_head_sites():
    cfg = ModelConfig(n_head=4, d_model=32, pe="alibi", kept_heads=((), (1, 3)))
    model = Transformer(cfg).eval()
    assert [m.n_kept for m in model.attention_modules()] == [0, 2]
    slopes = model.attention_modules()[1].score_bias.slopes
    assert torch.allclose(slopes, alibi_slopes(4)[[1, 3]])
    assert model(torch.randint(0, 32, (1, 5))).shape == (1, 5, 32)


def test_observer_is_removed_even_after_an_error():
    model = Transformer(ModelConfig())
    with pytest.raises(RuntimeError), model.observe(WantWeights()):
        raise RuntimeError("boom")
    assert all(m.observer is None for m in model.attention_modules())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pe": "alibii"}, "Did you mean 'alibi'"),
        ({"d_model": 30, "n_head": 4}, "not divisible"),
        ({"arch": "gpt"}, "Available: decoder"),
        ({"kept_heads": ((0, 9), (0,))}, "distinct ids"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, message):
    with pytest.raises(ProbeError, match=message):
        ModelConfig(**kwargs)


def test_config_round_trip_and_unknown_field():
    cfg = ModelConfig(arch="encoder-decoder", kept_heads=((0,), (1, 2), (0, 3), (3,), (2,), (1,)))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ProbeError, match="Did you mean 'n_head'"):
        ModelConfig.from_dict({"n_heads": 4})
