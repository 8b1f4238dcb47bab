"""The model in bfloat16 and float16 computes what it computes in float32, within what rounding
to that dtype costs (`precision.bound`), on every path: fused and explicit attention, the score
biases, rotary, both norms, sliding windows and padding, gates, folding, pruning and the
encoder-decoder. Positional quantities that rounding would spoil stay float32."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from precision import HALF, UNIT_ROUNDOFF, bound, rounded
from test_fire import fire_by_hand, fire_module

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.model.positional import ALiBi, Rotary, alibi_slopes
from probe.pruning.heads import masked, prune_heads
from probe.train_config import TrainConfig

VOCAB = 50
VARIANTS = {
    "learned-layernorm": dict(),
    "sinusoidal-post-ln": dict(pe="sinusoidal", norm="post"),
    "rope-rmsnorm-gqa-swiglu": dict(
        pe="rope",
        norm_type="rms",
        n_kv_head=2,
        ffn="swiglu",
        rope_fraction=0.5,
        qkv_bias=True,
        bias=False,
    ),
    "alibi-12-heads": dict(pe="alibi", n_head=12, d_model=48),
    "t5": dict(pe="t5"),
    "fire": dict(pe="fire"),
    "learned-scale-qk-norm-log-length": dict(
        scale="learned", qk_norm=True, log_scale_len=8, pe="none"
    ),
    "sliding-window": dict(pe="rope", sliding_window=5, n_kv_head=2),
    "encoder": dict(
        arch="encoder",
        pe="sinusoidal",
        embed_norm=True,
        head_transform=True,
        head_bias=True,
        type_vocab_size=2,
        ffn="gelu",
    ),
    "encoder-decoder": dict(arch="encoder-decoder", pe="sinusoidal", norm="post", embed_scale=True),
}


class Weights:
    """Observer that asks for the attention weights: the explicit path."""

    needs_weights = True

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    def record(self, call) -> None:
        self.dtypes.add(call.probs.dtype)


def model_for(name: str, seed: int = 0) -> Transformer:
    """A float32 model with weights far from the tiny init (attention far from uniform)."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=VOCAB, **VARIANTS[name])).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return model


def run(model: Transformer, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (3, 12), generator=g)
    source = torch.randint(0, VOCAB, (3, 9), generator=g) if model.encoder is not None else None
    with torch.no_grad():
        return model(tokens, source=source, key_mask=key_mask)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_half_precision_forward_matches_float32(name, dtype):
    """Fused and explicit paths in `dtype` against float32 on the same rounded weights, with and
    without padding (a padded row and a window past it leave queries that see no key)."""
    exact = rounded(model_for(name), dtype)
    half = copy.deepcopy(exact).to(dtype)
    want = run(exact)
    tol = bound(dtype, want.abs().max())
    fused = run(half)
    assert fused.dtype == dtype
    assert float((fused.float() - want).abs().max()) <= tol
    observer = Weights()
    with half.observe(observer):
        explicit = run(half)
    assert observer.dtypes == {torch.float32}  # observers see the unrounded softmax
    assert float((explicit.float() - want).abs().max()) <= tol
    if exact.encoder is not None:
        return
    keep = torch.ones(3, 12, dtype=torch.bool)
    keep[1, 4:] = False
    want = run(exact, keep)
    for path in (None, Weights()):
        if path is None:
            got = run(half, keep)
        else:
            with half.observe(path):
                got = run(half, keep)
        assert got.isfinite().all()
        assert float((got.float() - want)[keep].abs().max()) <= tol


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_rotary_angles_are_float32_and_only_cos_sin_are_rounded(dtype):
    """Far into a sequence, rotating in `dtype` errs by the rounding of x, cos and sin alone
    (a few u of |x|); frequencies rounded to `dtype` would give wrong angles."""
    cfg = ModelConfig(pe="rope", d_model=64, n_head=2)
    rotary = Rotary(cfg).to(dtype)
    assert rotary.inv_freq.dtype == torch.float32
    empty = Transformer.empty(cfg, dtype)
    assert empty.attention_modules()[0].rotary.inv_freq.dtype == torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 64, 32, generator=g).to(dtype)  # [batch, head, seq, d_head]
    positions = torch.arange(4000, 4064).view(1, -1)
    want = Rotary(cfg)(x.float(), positions)
    got = rotary(x, positions)
    u = UNIT_ROUNDOFF[dtype]
    assert float((got.float() - want).abs().max()) <= 4 * u * float(x.abs().max())
    wrong = Rotary(cfg)
    wrong.inv_freq = wrong.inv_freq.to(dtype).float()
    assert float((wrong(x.float(), positions) - want).abs().max()) > 40 * u * float(x.abs().max())


def test_alibi_slopes_stay_float32_through_casts_checkpoints_and_pruning(tmp_path):
    """Twelve heads have slopes bf16 cannot hold (2^-0.5, ...); 3000 keys back a rounded slope is
    a bias off by over 0.2, a weight off by over 20%. They stay float32 whatever the weights'
    dtype."""
    want = alibi_slopes(12)
    assert (want.bfloat16().float() - want).abs().max() * 3000 > 0.2  # what rounding would cost
    model = Transformer(ModelConfig(pe="alibi", n_head=12, d_model=48)).to(torch.bfloat16)
    module = model.attention_modules()[0].score_bias
    assert isinstance(module, ALiBi) and module.slopes.dtype == torch.float32
    assert torch.equal(module.slopes, want)
    q_pos, k_pos = torch.tensor([[3000]]), torch.tensor([[0, 1500]])
    bias = module.bias(q_pos, k_pos)  # [1, head, 1, 2]
    assert bias.dtype == torch.float32
    assert torch.allclose(bias[0, :, 0, 0], -want * 3000, rtol=1e-6, atol=0)
    path = save_checkpoint(tmp_path / "alibi", model, TaskConfig(), TrainConfig())
    loaded = load_checkpoint(path).model
    assert loaded.embed.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.attention_modules()[0].score_bias.slopes, want)
    pruned = prune_heads(loaded, [(0, 1), (0, 4)])
    kept = pruned.attention_modules()[0].score_bias.slopes
    assert kept.dtype == torch.float32 and torch.equal(kept, want[[0, 2, 3, *range(5, 12)]])


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_fire_runs_in_float32_on_half_precision_weights(dtype):
    """FIRE's bias on bf16/fp16 weights is the formula on those weights, to float32 precision."""
    model, module = fire_module(n_head=3)
    model.to(dtype)
    positions = torch.arange(10).view(1, -1)
    with torch.no_grad():
        bias = module.bias(positions, positions)  # [1, head, q, k]
    assert bias.dtype == torch.float32
    for i, j, h in [(0, 0, 0), (9, 2, 1), (7, 7, 2), (4, 0, 1)]:
        assert math.isclose(float(bias[0, h, i, j]), fire_by_hand(module, i, j, h),
                            rel_tol=1e-5, abs_tol=1e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_gates_folding_and_pruning_in_half_precision(dtype):
    """Fractional gates act as in float32; folding multiplies W_O in float32 and rounds once;
    pruning keeps every tensor's dtype and equals zeroing those heads' gates."""
    exact = rounded(model_for("rope-rmsnorm-gqa-swiglu"), dtype)
    gates = [torch.tensor([0.5, 0.0, 1.25, 0.75]), torch.tensor([1.0, 0.25, 0.0, 2.0])]
    exact.set_gates(gates)
    half = copy.deepcopy(exact).to(dtype)
    want = run(exact)
    tol = bound(dtype, want.abs().max())
    assert float((run(half).float() - want).abs().max()) <= tol
    before = [m.o.weight.detach().float().clone() for m in half.attention_modules()]
    folded = copy.deepcopy(half)
    for m in folded.attention_modules():
        m.fold_gates()
    for m, w, g in zip(folded.attention_modules(), before, gates, strict=True):
        scale = torch.where(g != 0, g, torch.ones_like(g)).repeat_interleave(m.d_head)
        assert torch.equal(m.o.weight, (w * scale).to(dtype))  # one rounding
        assert m.o.weight.dtype == m.gate.dtype == dtype
    assert float((run(folded).float() - want).abs().max()) <= tol
    half.set_gates(None)
    remove = [(0, 0), (0, 1), (1, 3)]  # layer 0 loses its first key/value group whole
    with masked(half, remove):
        gated = run(half)
    pruned = prune_heads(half, remove)
    assert {p.dtype for p in pruned.parameters()} == {dtype}
    assert pruned.attention_modules()[0].k.weight.shape[0] == pruned.cfg.d_head  # one kv head
    got = run(pruned)
    assert got.dtype == dtype
    assert float((got.float() - gated.float()).abs().max()) <= bound(dtype, gated.abs().max())
