"""What each llama.cpp architecture's GGUF tensors are in Hugging Face terms: a table per
`general.architecture`, holding its metadata -> config.json function (`gguf_configs`), its GGUF ->
Hugging Face tensor names and shapes, and the layout fix-ups that undo what llama.cpp's
`convert_hf_to_gguf.py` did to a tensor on the way in.

Shapes are written in a few letters read off the config (`_dims`): d = hidden size, f = feed-forward
size, q = query width (heads x head size), k = key/value width, v = vocabulary, h = head size,
3d = a fused q|k|v of equal widths, qkv = a fused q|k|v with grouped keys, 2f = a fused gate|up.

The fix-ups, each the inverse of the converter's step for that architecture:

- llama: q/k rows permuted from rotate_half halves to adjacent rotary pairs (`unpermute_rotary`).
- gemma, gemma2, gemma3: 1 added to every RMSNorm weight ("norm.weight"; Hugging Face's Gemma
  stores w and multiplies by 1 + w, llama.cpp multiplies by the stored weight): 1 is subtracted.
- gptneox: the fused query_key_value, Hugging Face's [head, (q, k, v), d_head] rows, regrouped as
  [(q, k, v), head, d_head] (`neox_qkv`); its bias alike.
- qwen3, olmo2, phi3 (NEOX rotary in llama.cpp, as in Hugging Face): stored as they are. Phi-3's
  fused qkv_proj and gate_up_proj stay fused, as Hugging Face's Phi3 holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from probe.interop.gguf_configs import CONFIGS
from probe.interop.gguf_meta import Meta

Fix = Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]


@dataclass(frozen=True)
class GGUFArch:
    name: str  # llama.cpp's `general.architecture`
    label: str  # the Hugging Face family, in messages ("Llama")
    config: Callable[[Meta], dict[str, Any]]  # metadata -> Hugging Face config.json dict
    globals: dict[str, tuple[str, tuple[str, ...]]]  # GGUF name -> (HF name, shape letters)
    blocks: dict[str, tuple[str, tuple[str, ...]]]  # inside blk.{i}. -> inside layer_prefix{i}.
    layer_prefix: str = "model.layers."
    fixes: dict[str, Fix] = field(default_factory=dict)  # GGUF name (blk.{i}. cut) -> undo step
    optional: frozenset[str] = frozenset({"output.weight"})  # may be absent (all layers alike)
    hint: str = ""  # what a tensor with no place means, in the refusal


def unpermute_rotary(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: interleaved rotary pairs back to rotate_half halves."""
    rows, cols = weight.shape
    d_head = rows // n_head
    pairs = weight.reshape(n_head, d_head // 2, 2, cols)  # [head, pair i, half, d_model]
    return pairs.transpose(1, 2).reshape(rows, cols)  # [head * half * pair i, d_model]


def neox_qkv(weight: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    """GGUF's [(q, k, v), head, d_head] rows (weight or bias) back to Hugging Face GPT-NeoX's
    [head, (q, k, v), d_head]."""
    n_head = config["num_attention_heads"]
    rest = weight.shape[1:]  # (d_model,) for the weight, () for the bias
    grouped = weight.reshape(3, n_head, -1, *rest)  # [3, head, d_head, *rest]
    return grouped.transpose(0, 1).reshape(weight.shape)  # [head, 3, d_head, *rest]


def minus_one(weight: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    """Gemma's RMSNorm weight as Hugging Face stores it: llama.cpp's (1 + w) less 1, in float32."""
    return (weight.float() - 1).to(weight.dtype)


def _dims(config: dict[str, Any]) -> dict[str, int]:
    d, n_head = config["hidden_size"], config["num_attention_heads"]
    h = config.get("head_dim") or d // n_head
    q, k = n_head * h, config.get("num_key_value_heads", n_head) * h
    f = config["intermediate_size"]
    return {"d": d, "f": f, "q": q, "k": k, "h": h, "v": config["vocab_size"], "3d": 3 * d,
            "qkv": q + 2 * k, "2f": 2 * f}  # fmt: skip


def expected_shapes(arch: GGUFArch, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape, for every tensor the table knows, in every layer."""
    dims = _dims(config)
    shapes = {hf: tuple(dims[x] for x in s) for hf, s in arch.globals.values()}
    for layer in range(config["num_hidden_layers"]):
        for hf, s in arch.blocks.values():
            shapes[f"{arch.layer_prefix}{layer}.{hf}"] = tuple(dims[x] for x in s)
    return shapes


_LLAMA_GLOBALS = {
    "token_embd.weight": ("model.embed_tokens.weight", ("v", "d")),
    "output_norm.weight": ("model.norm.weight", ("d",)),
    "output.weight": ("lm_head.weight", ("v", "d")),
}
_ATTENTION = {
    "attn_q.weight": ("self_attn.q_proj.weight", ("q", "d")),
    "attn_k.weight": ("self_attn.k_proj.weight", ("k", "d")),
    "attn_v.weight": ("self_attn.v_proj.weight", ("k", "d")),
    "attn_output.weight": ("self_attn.o_proj.weight", ("d", "q")),
}
_GATED_FFN = {
    "ffn_gate.weight": ("mlp.gate_proj.weight", ("f", "d")),
    "ffn_up.weight": ("mlp.up_proj.weight", ("f", "d")),
    "ffn_down.weight": ("mlp.down_proj.weight", ("d", "f")),
}
_PRE_NORMS = {
    "attn_norm.weight": ("input_layernorm.weight", ("d",)),
    "ffn_norm.weight": ("post_attention_layernorm.weight", ("d",)),
}
_QK_NORM_PER_HEAD = {
    "attn_q_norm.weight": ("self_attn.q_norm.weight", ("h",)),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", ("h",)),
}
_SANDWICH_NORMS = {  # Gemma 2 and 3: a norm before and after attention and the feed-forward
    "attn_norm.weight": ("input_layernorm.weight", ("d",)),
    "post_attention_norm.weight": ("post_attention_layernorm.weight", ("d",)),
    "ffn_norm.weight": ("pre_feedforward_layernorm.weight", ("d",)),
    "post_ffw_norm.weight": ("post_feedforward_layernorm.weight", ("d",)),
}
_GEMMA_HINT = "Gemma has no biases or experts"
_GEMMA_NORMS = {"output_norm.weight": minus_one}


def _norm_fixes(blocks: dict[str, Any]) -> dict[str, Fix]:
    return {**_GEMMA_NORMS, **{n: minus_one for n in blocks if n.endswith("norm.weight")}}


_GEMMA2_BLOCKS = {**_ATTENTION, **_GATED_FFN, **_SANDWICH_NORMS}
_GEMMA3_BLOCKS = {**_GEMMA2_BLOCKS, **_QK_NORM_PER_HEAD}
_NEOX_LAYERS = {  # each with a weight and a bias (of the weight's first dimension)
    "attn_norm": ("input_layernorm", ("d",)),
    "attn_qkv": ("attention.query_key_value", ("3d", "d")),
    "attn_output": ("attention.dense", ("d", "d")),
    "ffn_norm": ("post_attention_layernorm", ("d",)),
    "ffn_up": ("mlp.dense_h_to_4h", ("f", "d")),
    "ffn_down": ("mlp.dense_4h_to_h", ("d", "f")),
}
_NEOX_BLOCKS = {
    f"{gguf}.{kind}": (f"{hf}.{kind}", shape if kind == "weight" else shape[:1])
    for gguf, (hf, shape) in _NEOX_LAYERS.items()
    for kind in ("weight", "bias")
}

ARCHS: dict[str, GGUFArch] = {
    a.name: a
    for a in (
        GGUFArch(
            "llama", "Llama", CONFIGS["llama"], _LLAMA_GLOBALS,
            {**_ATTENTION, **_GATED_FFN, **_PRE_NORMS},
            fixes={"attn_q.weight": lambda w, c: unpermute_rotary(w, c["num_attention_heads"]),
                   "attn_k.weight": lambda w, c: unpermute_rotary(w, c["num_key_value_heads"])},
            hint="only plain Llama checkpoints are supported: no biases or experts",
        ),
        GGUFArch(
            "qwen3", "Qwen3", CONFIGS["qwen3"], _LLAMA_GLOBALS,
            {**_ATTENTION, **_QK_NORM_PER_HEAD, **_GATED_FFN, **_PRE_NORMS},
            hint="Qwen3 has no biases; mixture-of-experts Qwen3 is qwen3moe",
        ),
        GGUFArch(
            "gemma", "Gemma", CONFIGS["gemma"], _LLAMA_GLOBALS,
            {**_ATTENTION, **_GATED_FFN, **_PRE_NORMS},
            fixes=_norm_fixes(_PRE_NORMS), hint=_GEMMA_HINT,
        ),
        GGUFArch(
            "gemma2", "Gemma 2", CONFIGS["gemma2"], _LLAMA_GLOBALS, _GEMMA2_BLOCKS,
            fixes=_norm_fixes(_GEMMA2_BLOCKS), hint=_GEMMA_HINT,
        ),
        GGUFArch(
            "gemma3", "Gemma 3", CONFIGS["gemma3"], _LLAMA_GLOBALS, _GEMMA3_BLOCKS,
            fixes=_norm_fixes(_GEMMA3_BLOCKS), hint=_GEMMA_HINT + " (the text model only)",
        ),
        GGUFArch(
            "phi3", "Phi-3", CONFIGS["phi3"], _LLAMA_GLOBALS,
            {"attn_qkv.weight": ("self_attn.qkv_proj.weight", ("qkv", "d")),
             "attn_output.weight": ("self_attn.o_proj.weight", ("d", "q")),
             "ffn_up.weight": ("mlp.gate_up_proj.weight", ("2f", "d")),
             "ffn_down.weight": ("mlp.down_proj.weight", ("d", "f")), **_PRE_NORMS},
            hint="Phi-3 has fused qkv and gate|up only",
        ),
        GGUFArch(
            "olmo2", "OLMo-2", CONFIGS["olmo2"], _LLAMA_GLOBALS,
            {**_ATTENTION, **_GATED_FFN,
             "attn_q_norm.weight": ("self_attn.q_norm.weight", ("q",)),
             "attn_k_norm.weight": ("self_attn.k_norm.weight", ("k",)),
             "post_attention_norm.weight": ("post_attention_layernorm.weight", ("d",)),
             "post_ffw_norm.weight": ("post_feedforward_layernorm.weight", ("d",))},
            hint="OLMo-2 has no biases or experts",
        ),
        GGUFArch(
            "gptneox", "GPT-NeoX", CONFIGS["gptneox"],
            {"token_embd.weight": ("gpt_neox.embed_in.weight", ("v", "d")),
             "output_norm.weight": ("gpt_neox.final_layer_norm.weight", ("d",)),
             "output_norm.bias": ("gpt_neox.final_layer_norm.bias", ("d",)),
             "output.weight": ("embed_out.weight", ("v", "d"))},
            _NEOX_BLOCKS, layer_prefix="gpt_neox.layers.",
            fixes={"attn_qkv.weight": neox_qkv, "attn_qkv.bias": neox_qkv},
            optional=frozenset({"output.weight", "attn_qkv.bias", "attn_output.bias"}),
            hint="GPT-NeoX holds a fused qkv, biases and LayerNorms",
        ),
    )
}  # fmt: skip
SUPPORTED_ARCHITECTURES = tuple(ARCHS)  # llama first
