"""Phi-3 family: the Llama block (pre-norm RMSNorm, SwiGLU, rotate-half rotary, no biases,
grouped-query attention) with q, k and v in one fused `qkv_proj` ([q | k | v] rows) and gate and
up in one fused `gate_up_proj` ([gate | up] rows: transformers' Phi3MLP chunks gate first), split
on import and re-fused on export; rotary on the first `partial_rotary_factor` of each head; and
`sliding_window` on every layer when set (Phi3Model builds transformers' sliding-window causal
mask, the rule of Mistral). Dropouts (`resid_pdrop`, `embd_pdrop`, `attention_dropout`) act in
training only. The rotary is the plain one or LongRoPE (Phi-3.5, Phi-4-mini; `rope_type`
'longrope', or 'su' and 'yarn', which Phi3Config reads as longrope), anchored at the top-level
`original_max_position_embeddings` (4096 when absent), which wins over the section's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import FFN, PE, Arch, ModelConfig, Norm, NormType
from probe.errors import ProbeError
from probe.interop.families import (
    llama_names,
    refuse_unimplemented,
    renamed,
    require,
    same_tied_head,
    tied_output,
    uniform_shape,
)
from probe.interop.fields import Fields
from probe.interop.hf_llama import rope
from probe.interop.hf_rope import rotary_to_hf

FUSED = ("q", "k", "v", "gate", "up")  # Phi-3 stores these as qkv_proj and gate_up_proj
MODEL_TYPES = ("phi3",)
# source tensors probe may leave unused: the rotary frequencies of older files, a tied lm_head
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")
RENAMED = {"su": "longrope", "yarn": "longrope"}  # rotary kinds Phi3Config reads as longrope


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    refuse_unimplemented(hf, "Phi-3", implemented=("partial_rotary_factor",))
    hf.choice("hidden_act", "silu", ("silu",), "Phi-3")
    d_model = hf.integer("hidden_size")
    n_head = hf.integer("num_attention_heads")
    n_kv_head = hf.integer("num_key_value_heads", n_head)  # read first: 0 is refused by name
    if hf.has("num_key_value_heads"):
        hf.divides("num_attention_heads", "num_key_value_heads")
    if not hf.has("head_dim"):
        hf.divides("hidden_size", "num_attention_heads")
    d_head = hf.integer("head_dim", d_model // n_head)
    context = hf.integer("max_position_embeddings", 4096)
    original = hf.integer("original_max_position_embeddings", 4096)
    rotary = rope(hf, context, "Phi-3", partial=True, renamed=RENAMED, top_original=original)
    kind, fraction = rotary["rope_scaling"].kind, rotary["rope_fraction"]
    if kind not in ("default", "longrope"):  # transformers' Phi3Config refuses the others
        hf.refuse("rope_parameters.rope_type", kind, "Phi-3 computes rope_type 'default' or "
                  "'longrope' (transformers refuses the others).")  # fmt: skip
    rotated = int(d_head * fraction)  # transformers' rotary width: int(head_dim * factor)
    if rotated % 2 or rotated < 2:
        why = f"it rotates {rotated} of each head's {d_head} dimensions; probe's rotary needs "
        hf.refuse("partial_rotary_factor", fraction, why + "an even number of at least 2.")
    window = hf.integer("sliding_window", None)
    return ModelConfig(
        arch=Arch.DECODER,
        vocab_size=hf.integer("vocab_size"),
        n_layer=hf.integer("num_hidden_layers"),
        n_head=n_head,
        n_kv_head=n_kv_head,
        d_model=d_model,
        d_head=d_head,
        ffn=FFN.SWIGLU,
        ffn_mult=hf.integer("intermediate_size") / d_model,
        norm=Norm.PRE,
        norm_type=NormType.RMS,
        pe=PE.ROPE,
        **rotary,
        max_len=context,
        bias=False,
        tie_embeddings=tied_output(hf, names, default=False),
        ln_eps=hf.number("rms_norm_eps", 1e-5),
        sliding_window=window,
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
    shape = uniform_shape(cfg)
    if isinstance(shape, str):
        raise ProbeError(
            f"This pruned model cannot be written as a Hugging Face Phi-3: {shape}, but its "
            "config.json has one head count for every layer. Prune with `probe prune --uniform` "
            "(the same number of heads, or groups, in every layer) to make it exportable."
        )
    if cfg.window_layers is not None:
        raise ProbeError(
            "Phi-3 windows every layer or none; this model windows only layers "
            f"{list(cfg.window_layers)}, which a Phi-3 config cannot hold."
        )
    n_q, n_kv = shape
    original = cfg.rope_scaling.original_max_position_embeddings  # longrope's (else None)
    weights = {hf: state[p] for hf, p in llama_names(cfg, fused=FUSED).items()}
    for name, parts in _fused(cfg).items():
        weights[name] = torch.cat([state[p] for p, _ in parts])  # [rows of every part, d_model]
    hf = {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": n_q,
        "num_key_value_heads": n_kv,
        "head_dim": cfg.d_head,  # read by Phi3Attention; a pruned model's is not d_model / n_q
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len,
        "original_max_position_embeddings": original or cfg.max_len,
        "rms_norm_eps": cfg.ln_eps,
        "rope_parameters": rotary_to_hf(cfg, fraction=True),
        "partial_rotary_factor": cfg.rope_fraction,
        "sliding_window": cfg.sliding_window,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    return hf, weights
