"""The modern families' model features (soft-capping, sliding windows with a local rotary base,
sandwich and branch norms, parallel residuals, QK-norm over every head): attention statistics
are of the scores a row really uses, computed here by hand; a physically pruned model equals
the gated one; contradictory settings are one line each. Parity of each feature with
transformers is in the family tests (tests/test_family_*.py)."""

from __future__ import annotations

import math

import pytest
import torch

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.measure.observe import AttentionStats
from probe.measure.streaming import row_statistics
from probe.model import Transformer
from probe.pruning.heads import masked, prune_heads

VARIANTS = {
    "gemma2-like": dict(
        norm="sandwich",
        norm_type="rms",
        norm_offset=1.0,
        norm_gain_float32=True,
        ffn="geglu",
        attn_softcap=5.0,
        final_softcap=3.0,
        scale_dim=12.0,
        embed_scale=True,
        pe="rope",
        d_head=24,
        n_kv_head=2,
        sliding_window=3,
        window_layers=(0,),
    ),
    "gemma3-like": dict(
        norm="sandwich",
        norm_type="rms",
        norm_offset=1.0,
        qk_norm=True,
        pe="rope",
        sliding_window=3,
        window_layers=(0,),
        rope_local_base=100.0,
        ffn="geglu",
    ),
    "olmo2-like": dict(
        norm="branch",
        norm_type="rms",
        norm_gain_float32=True,
        qk_norm=True,
        qk_norm_whole=True,
        n_kv_head=2,
        pe="rope",
        ffn="swiglu",
        bias=False,
    ),
    "neox-like": dict(parallel_residual=True, pe="rope", rope_fraction=0.25, ffn="gelu"),
}


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, n_layer=2, n_head=4, d_model=32, **kw)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # norms and biases away from 1 and 0, so a mis-wired one shows
        for name, p in model.named_parameters():
            if p.dim() == 1 and p.numel() > 1 and not name.endswith("gate"):
                p.add_(0.2 * torch.randn_like(p))
    return model


class Calls:
    """Keeps each attention call's q, k and visibility (the test's own record)."""

    needs_weights = False

    def __init__(self):
        self.calls = []

    def record(self, call):
        self.calls.append(call)


def by_hand(call) -> dict[str, torch.Tensor]:
    """Entropy, max logit and normalized entropy of every row, from q and k by the formulas."""
    scores = call.q.double() @ call.k.double().transpose(-2, -1)  # [b, h, q, k]
    scores = scores * call.scale.double().view(1, -1, 1, 1)
    if call.softcap is not None:
        scores = call.softcap * torch.tanh(scores / call.softcap)
    q_len, k_len = scores.shape[-2:]
    i = torch.arange(q_len).view(-1, 1) + (k_len - q_len)
    j = torch.arange(k_len).view(1, -1)
    seen = j <= i
    if call.site.window is not None:
        seen = seen & (i - j < call.site.window)
    scores = scores.masked_fill(~seen, -math.inf)
    p = scores.softmax(-1)
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)
    n = seen.sum(-1).double()  # [q] keys each row sees
    return {
        "entropy": entropy,
        "max_logit": scores.amax(-1),
        "normalized_entropy": torch.where(n > 1, entropy / n.clamp_min(2).log(), math.nan),
    }


@pytest.mark.parametrize("stream", [False, True])
def test_statistics_are_of_the_soft_capped_windowed_scores(stream):
    model = tiny(**VARIANTS["gemma2-like"])
    tokens = torch.randint(0, 50, (2, 9))
    calls = Calls()
    with torch.no_grad(), model.observe(calls):
        model(tokens)
    assert [c.site.window for c in calls.calls] == [3, None]
    names = ["entropy", "max_logit", "normalized_entropy"]
    for call in calls.calls:
        assert call.softcap == 5.0
        got = row_statistics(call, names, tile=4, stream=stream)
        want = by_hand(call)
        for name in names:
            torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-5,
                                       equal_nan=True)  # fmt: skip
        # a capped logit never exceeds the cap (the raw scores here do, so it bites)
        assert float(got["max_logit"].max()) < 5.0


def test_soft_capped_attention_output_is_the_explicit_formula():
    """The model's own output (no observer: the path a plain forward takes) equals softmax of
    the capped scores times v, recomputed from the recorded q, k, v."""
    model = tiny(**VARIANTS["gemma2-like"])
    tokens = torch.randint(0, 50, (2, 9))
    calls = Calls()
    with torch.no_grad(), model.observe(calls):
        observed = model(tokens)
    with torch.no_grad():
        plain = model(tokens)
    torch.testing.assert_close(plain, observed)
    call = calls.calls[0]
    scores = (
        call.q.double() @ call.k.double().transpose(-2, -1) * call.scale.double().view(1, -1, 1, 1)
    )
    scores = 5.0 * torch.tanh(scores / 5.0)
    i, j = torch.arange(9).view(-1, 1), torch.arange(9).view(1, -1)
    scores = scores.masked_fill(~((j <= i) & (i - j < 3)), -math.inf)
    out = scores.softmax(-1) @ call.v.double()
    torch.testing.assert_close(call.head_out.double(), out, atol=1e-6, rtol=1e-6)


def test_final_soft_cap_bounds_the_logits():
    model = tiny(**VARIANTS["gemma2-like"])
    with torch.no_grad():
        logits = model(torch.randint(0, 50, (2, 9)))
        raw = model.head(model.features(torch.randint(0, 50, (1, 3))))
    assert float(logits.abs().max()) < 3.0
    assert raw.shape[-1] == 50


def test_local_layers_rotate_with_their_own_base():
    model = tiny(**VARIANTS["gemma3-like"])
    assert [m.rotary.base for m in model.attention_modules()] == [100.0, 10000.0]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_pruned_equals_gated(name):
    model = tiny(**VARIANTS[name])
    tokens = torch.randint(0, 50, (2, 9))
    remove = [(0, 0), (0, 1), (1, 3)]  # with two groups, layer 0 loses group 0 whole
    with torch.no_grad(), masked(model, remove):
        want = model(tokens)
        stats_gated = AttentionStats(["entropy", "max_logit"])
        with model.observe(stats_gated):
            model(tokens)
    pruned = prune_heads(model, remove)
    with torch.no_grad():
        got = pruned(tokens)
        stats = AttentionStats(["entropy", "max_logit"])
        with pruned.observe(stats):
            pruned(tokens)
    assert (got - want).abs().max() < 1e-5
    kept = stats_gated.table().merge(stats.table(), on=["layer", "head", "statistic"])
    assert len(kept) == 2 * (4 + 4 - 3)  # each statistic of every head left
    assert (kept.value_x - kept.value_y).abs().max() < 1e-5


def test_whole_head_qk_norm_keeps_every_q_and_k_row_when_pruned():
    """Its statistic spans every head, so removing a head must not change the others' q: the
    pruned model keeps the rows and reads the kept heads' ones."""
    model = tiny(**VARIANTS["olmo2-like"])
    pruned = prune_heads(model, [(0, 0), (0, 1)])
    attn = pruned.blocks[0].attn
    assert attn.q.weight.shape == (4 * 8, 32) and attn.k.weight.shape == (2 * 8, 32)
    assert attn.v.weight.shape == (1 * 8, 32) and attn.o.weight.shape == (32, 2 * 8)
    assert attn.q_rows.tolist() == list(range(16, 32))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (dict(parallel_residual=True, norm="post"), "parallel_residual"),
        (dict(parallel_residual=True, ffn="none"), "parallel_residual"),
        (dict(qk_norm_whole=True), "qk_norm_whole"),
        (dict(rope_local_base=100.0, pe="rope"), "rope_local_base"),
        (dict(rope_local_base=0.5, pe="rope", sliding_window=4), "rope_local_base"),
        (dict(scale_dim=16.0, scale="inverse"), "scale_dim"),
        (dict(attn_softcap=0.0), "attn_softcap"),
        (dict(final_softcap=-1.0), "final_softcap"),
        (dict(norm_offset=1.0), "norm_offset"),
        (dict(norm_offset=math.inf, norm_type="rms"), "norm_offset"),
    ],
)
def test_contradictory_settings_are_one_line(settings, named):
    with pytest.raises(ProbeError, match=named) as err:
        ModelConfig(**settings)
    assert "\n" not in str(err.value)


def test_new_fields_keep_the_cache_keys_of_older_configs():
    from probe.study.grid.cells import _key_dict

    plain = _key_dict(ModelConfig(), "model")
    for name in ("norm_offset", "parallel_residual", "attn_softcap", "rope_local_base"):
        assert name not in plain
    assert _key_dict(ModelConfig(attn_softcap=2.0), "model")["attn_softcap"] == 2.0


@pytest.mark.parametrize("model_type", ["mixtral", "mamba", "deepseek_v3"])
def test_a_known_architecture_probe_cannot_express_names_what_is_missing(model_type):
    from probe.interop.families import MISSING, family

    with pytest.raises(ProbeError) as err:
        family({"model_type": model_type}, "/m")
    message = str(err.value)
    assert MISSING[model_type] in message and "llama" in message and "\n" not in message
