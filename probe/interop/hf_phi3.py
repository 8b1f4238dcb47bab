"""Phi-3 family: the Llama block (probe.interop.hf_llama: pre-norm RMSNorm, SwiGLU, rotate-half
rotary, no biases, grouped-query attention) with q, k and v in one fused `qkv_proj` ([q | k | v]
rows) and gate and up in one fused `gate_up_proj` ([gate | up] rows: transformers' Phi3MLP
chunks gate first), split on import and re-fused on export; rotary on the first
`partial_rotary_factor` of each head; and `sliding_window` on every layer when set (Phi3Model
builds transformers' sliding-window causal mask, the rule of Mistral). Dropouts (`resid_pdrop`,
`embd_pdrop`, `attention_dropout`) act in training only. The rotary is the plain one or LongRoPE
(Phi-3.5, Phi-4-mini; `rope_type` 'longrope', or 'su' and 'yarn', which Phi3Config reads as
longrope), anchored at the top-level `original_max_position_embeddings` (4096 when absent),
which wins over the section's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import FFN, ModelConfig
from probe.errors import ProbeError
from probe.interop import hf_llama
from probe.interop.family_parts import (
    gated,
    llama_names,
    refuse_unimplemented,
    renamed,
    require,
    same_tied_head,
    tied_output,
    uniform_heads,
)
from probe.interop.fields import Fields
from probe.interop.hf_llama import rope
from probe.interop.hf_rope import rotary_to_hf

FUSED = ("q", "k", "v", "gate", "up")  # Phi-3 stores these as qkv_proj and gate_up_proj
MODEL_TYPES = ("phi3",)
# source tensors probe may leave unused: the rotary frequencies of older files, a tied lm_head
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")
RENAMED = {"su": "longrope", "yarn": "longrope"}  # rotary kinds Phi3Config reads as longrope
DEFAULTS = {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5}  # Phi3Config's


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    refuse_unimplemented(hf, "Phi-3", implemented=("partial_rotary_factor",))
    gated(hf, "hidden_act", FFN.SWIGLU, "Phi-3")
    block = hf_llama.keywords(hf, DEFAULTS)
    original = hf.integer("original_max_position_embeddings", 4096)
    rotary = rope(hf, block["max_len"], "Phi-3", partial=True, renamed=RENAMED,
                  top_original=original)  # fmt: skip
    kind, fraction = rotary["rope_scaling"].kind, rotary["rope_fraction"]
    if kind not in ("default", "longrope"):  # transformers' Phi3Config refuses the others
        hf.refuse("rope_parameters.rope_type", kind, "Phi-3 computes rope_type 'default' or "
                  "'longrope' (transformers refuses the others).")  # fmt: skip
    d_head = block["d_head"]
    rotated = int(d_head * fraction)  # transformers' rotary width: int(head_dim * factor)
    if rotated % 2 or rotated < 2:
        why = f"it rotates {rotated} of each head's {d_head} dimensions; probe's rotary needs "
        hf.refuse("partial_rotary_factor", fraction, why + "an even number of at least 2.")
    return ModelConfig(
        **block,
        **rotary,
        tie_embeddings=tied_output(hf, names, default=False),
        sliding_window=hf.integer("sliding_window", None),
    )


def _fused(cfg: ModelConfig) -> dict[str, list[tuple[str, int]]]:
    """Fused Hugging Face name -> its parts in row order: (probe name, rows)."""
    q, kv, ff = cfg.n_head * cfg.d_head, cfg.kv_heads * cfg.d_head, cfg.d_ff
    fused = {}
    for i in range(cfg.n_layer):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        fused[f"{h}self_attn.qkv_proj.weight"] = [(f"{b}attn.q.weight", q),
                                                  (f"{b}attn.k.weight", kv),
                                                  (f"{b}attn.v.weight", kv)]  # fmt: skip
        fused[f"{h}mlp.gate_up_proj.weight"] = [(f"{b}ffn.gate.weight", ff),
                                                (f"{b}ffn.up.weight", ff)]  # fmt: skip
    return fused


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    fused = _fused(cfg)
    require(state, fused, where)
    if cfg.tie_embeddings:
        same_tied_head(state, "model.embed_tokens.weight", "lm_head.weight", where)
    for name, parts in fused.items():
        tensor = state[name]  # [rows, d_model]
        rows = sum(n for _, n in parts)
        if tensor.dim() != 2 or tensor.shape[0] != rows:
            raise ProbeError(
                f"{where}: '{name}' has shape {tuple(tensor.shape)} but config.json implies "
                f"{rows} rows; weights and config do not belong together."
            )
        yield from zip((p for p, _ in parts), tensor.split([n for _, n in parts]), strict=True)
    yield from renamed(state, llama_names(cfg, fused=FUSED), where)


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """Llama's config.json with Phi-3's fused weights, partial rotary, LongRoPE anchor and
    window, and without the bias keys Phi3Config lacks."""
    heads = uniform_heads(cfg, "Phi-3")
    if cfg.window_layers is not None:
        raise ProbeError(
            "Phi-3 windows every layer or none; this model windows only layers "
            f"{list(cfg.window_layers)}, which a Phi-3 config cannot hold."
        )
    original = cfg.rope_scaling.original_max_position_embeddings  # longrope's (else None)
    weights = {hf: state[p] for hf, p in llama_names(cfg, fused=FUSED).items()}
    for name, parts in _fused(cfg).items():
        weights[name] = torch.cat([state[p] for p, _ in parts])  # [rows of every part, d_model]
    # Llama's config.json keeps head_dim (Phi3Attention reads it: a pruned model's is not
    # d_model / n_q); Phi3Config has no bias flags
    hf = hf_llama.written(cfg, heads)
    del hf["attention_bias"], hf["mlp_bias"]
    return {
        **hf,
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "original_max_position_embeddings": original or cfg.max_len,
        "rope_parameters": rotary_to_hf(cfg, fraction=True),
        "partial_rotary_factor": cfg.rope_fraction,
        "sliding_window": cfg.sliding_window,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id")),
    }, weights
