"""Cached decoding equals the full forward pass: a prompt, then one token at a time through the
key/value cache, gives at every step the logits the whole sequence gives at that position, for
every positional encoding (rotary, ALiBi, T5, FIRE, learned, sinusoidal, none), grouped-query
attention, sliding windows, soft-capping, QK-norm, log-length scaling, a pruned model, and a tiny
model of every imported family."""

from __future__ import annotations

import pytest
import torch
from family_models import FAMILIES, save_tiny

from probe.config import ModelConfig
from probe.model import Transformer
from probe.pruning.heads import prune_heads

CONFIGS = {
    "rope-gqa": dict(pe="rope", n_kv_head=2, norm_type="rms", ffn="swiglu", bias=False),
    "alibi": dict(pe="alibi"),
    "t5": dict(pe="t5"),
    "fire": dict(pe="fire"),
    "learned": dict(pe="learned"),
    "sinusoidal": dict(pe="sinusoidal", norm="post", embed_scale=True),
    "none": dict(pe="none", scale="learned"),
    "window": dict(pe="rope", sliding_window=3, window_layers=(0,), n_kv_head=1),
    "gemma2-like": dict(
        pe="rope",
        norm="sandwich",
        norm_type="rms",
        norm_offset=1.0,
        attn_softcap=4.0,
        final_softcap=8.0,
        scale_dim=10.0,
        ffn="geglu",
        sliding_window=4,
        window_layers=(1,),
        rope_local_base=100.0,
    ),
    "olmo2-like": dict(
        pe="rope", norm="branch", norm_type="rms", qk_norm=True, qk_norm_whole=True, n_kv_head=2
    ),
    "neox-like": dict(pe="rope", parallel_residual=True, rope_fraction=0.5, ffn="gelu"),
    "log-length": dict(pe="rope", log_scale_len=8, qk_norm=True),
}


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, n_layer=2, n_head=4, d_model=32, max_len=64, **kw)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            elif not name.endswith("gate"):
                p.add_(0.2 * torch.randn_like(p))
    return model


def decode_matches_full(model: Transformer, tokens: torch.Tensor, prompt: int, tol: float):
    """Prefill `prompt` tokens, then feed the rest one at a time; each step's logits must equal
    the full forward's at that position."""
    with torch.no_grad():
        full = model(tokens)  # [batch, seq, vocab]
        cache = model.new_cache()
        steps = [model(tokens[:, :prompt], cache=cache)]
        for i in range(prompt, tokens.shape[1]):
            steps.append(model(tokens[:, i : i + 1], cache=cache))
    cached = torch.cat(steps, dim=1)
    assert cached.shape == full.shape
    gap = float((cached - full).abs().max())
    assert gap <= tol, gap
    assert cache.length == tokens.shape[1]
    return cache


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_equals_the_full_forward(name):
    model = tiny(**CONFIGS[name])
    tokens = torch.randint(0, 40, (2, 13), generator=torch.Generator().manual_seed(1))
    cache = decode_matches_full(model, tokens, prompt=5, tol=1e-4)
    # the cache holds one row per key/value head, for every token
    kv = model.cfg.kv_heads
    d = model.cfg.d_head
    assert cache.sites[0].k.shape == (2, kv, 13, d)
    assert cache.nbytes == 2 * 2 * (2 * kv * 13 * d) * 4  # layers x (k, v) x elements x float32


def test_a_pruned_model_decodes_with_its_own_groups():
    model = prune_heads(tiny(**CONFIGS["rope-gqa"]), [(0, 0), (0, 1), (1, 3)])
    tokens = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(2))
    cache = decode_matches_full(model, tokens, prompt=1, tol=1e-4)
    assert cache.sites[0].k.shape[1] == 1  # layer 0 kept one of its two groups


def test_bf16_decoding_equals_the_bf16_full_forward():
    model = tiny(**CONFIGS["rope-gqa"]).to(torch.bfloat16)
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(3))
    decode_matches_full(model, tokens, prompt=4, tol=0.1)  # bf16 rounding of separate passes


def test_padding_in_the_prompt_is_masked_in_every_later_step():
    model = tiny(**CONFIGS["alibi"])
    tokens = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(4))
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[1, 2] = False  # a padded token inside row 1's prompt
    with torch.no_grad():
        full = model(tokens, key_mask=keep)
        cache = model.new_cache()
        first = model(tokens[:, :5], key_mask=keep[:, :5], cache=cache)
        rest = [model(tokens[:, i : i + 1], cache=cache) for i in range(5, 8)]
    cached = torch.cat([first, *rest], dim=1)
    assert float((cached - full)[keep].abs().max()) < 1e-4


def test_an_encoder_has_no_cache():
    model = tiny(arch="encoder")
    with pytest.raises(ValueError, match="decoder"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=model.new_cache())


@pytest.mark.parametrize("kind", ["llama", "gpt2", *FAMILIES])
def test_every_imported_family_decodes_as_its_full_forward(kind, tmp_path):
    pytest.importorskip("transformers")
    from test_cli_imported import hf_dir

    from probe.interop.importer import import_model

    if kind == "gpt2":
        import transformers

        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4)
        transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
        source = tmp_path / "gpt2"
    elif kind == "llama":
        source = hf_dir("llama", tmp_path)
    else:
        source = save_tiny(kind, tmp_path)
    model = import_model(source).model
    tokens = torch.randint(0, 99, (2, 14), generator=torch.Generator().manual_seed(5))
    decode_matches_full(model, tokens, prompt=6, tol=1e-4)  # past every sliding window (6)
