"""Llama family (Llama, Mistral, Qwen2, SmolLM): pre-norm RMSNorm, SwiGLU, rotary position
embedding with the config's base (rotate-half layout, as probe's `Rotary`), no biases (Qwen2:
biases on q, k and v), tied or untied output, grouped-query attention."""

from __future__ import annotations

from typing import Any

import torch

from probe.config import FFN, PE, Arch, ModelConfig, Norm, NormType
from probe.errors import ProbeError
from probe.interop.families import number, rename, tied_output

MODEL_TYPES = ("llama", "mistral", "qwen2")


def _rope_theta(hf: dict[str, Any], where: str) -> float:
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ProbeError(
            f"{where}: rotary scaling '{kind}' is not supported; probe imports the plain rotary "
            "embedding (rope_type 'default')."
        )
    return float(params.get("rope_theta") or hf.get("rope_theta") or 10000.0)


def config(hf: dict[str, Any], where: str, names: set[str] | None = None) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ProbeError(f"{where}: hidden_act '{act}' is not supported; Llama-family uses silu.")
    if hf.get("mlp_bias"):
        raise ProbeError(f"{where}: Llama with mlp_bias is not supported.")
    d_model = number(hf, "hidden_size", where)
    n_head = number(hf, "num_attention_heads", where)
    qkv_bias = hf["model_type"] == "qwen2" or bool(hf.get("attention_bias", False))
    tied = tied_output(hf, names, default=False)
    return ModelConfig(
        arch=Arch.DECODER,
        vocab_size=number(hf, "vocab_size", where),
        n_layer=number(hf, "num_hidden_layers", where),
        n_head=n_head,
        n_kv_head=int(hf.get("num_key_value_heads") or n_head),
        d_model=d_model,
        d_head=int(hf.get("head_dim") or d_model // n_head),
        ffn=FFN.SWIGLU,
        ffn_mult=number(hf, "intermediate_size", where) / d_model,
        norm=Norm.PRE,
        norm_type=NormType.RMS,
        pe=PE.ROPE,
        rope_base=_rope_theta(hf, where),
        max_len=int(hf.get("max_position_embeddings") or 2048),
        bias=False,
        qkv_bias=qkv_bias,
        tie_embeddings=tied,
        ln_eps=float(hf.get("rms_norm_eps", 1e-6)),
    )


def _names(cfg: ModelConfig) -> dict[str, str]:
    """Hugging Face name -> probe name."""
    names = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "ln_final.weight"}
    for i in range(cfg.n_layer):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        names |= {
            f"{h}input_layernorm.weight": f"{b}ln_attn.weight",
            f"{h}post_attention_layernorm.weight": f"{b}ln_ffn.weight",
            f"{h}self_attn.o_proj.weight": f"{b}attn.o.weight",
            f"{h}mlp.gate_proj.weight": f"{b}ffn.gate.weight",
            f"{h}mlp.up_proj.weight": f"{b}ffn.up.weight",
            f"{h}mlp.down_proj.weight": f"{b}ffn.down.weight",
        }
        for x in "qkv":
            names[f"{h}self_attn.{x}_proj.weight"] = f"{b}attn.{x}.weight"
            if cfg.qkv_bias:
                names[f"{h}self_attn.{x}_proj.bias"] = f"{b}attn.{x}.bias"
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    return names


def to_probe(state: dict[str, torch.Tensor], cfg: ModelConfig, where: str) -> dict:
    return rename(state, _names(cfg), where)


def uniform_shape(cfg: ModelConfig) -> tuple[int, int] | str:
    """(query heads, key/value heads) shared by every layer, or why there is none."""
    shapes = set()
    for site in cfg.sites():
        per_group = {len(site.group_heads(g)) for g in site.kept_groups}
        if not site.kept_heads:
            return f"{site.name} has no heads left"
        if len(per_group) != 1:
            return f"{site.name} keeps different numbers of query heads in its key/value groups"
        shapes.add((len(site.kept_heads), len(site.kept_groups)))
    if len(shapes) != 1:
        found = ", ".join(f"{q} heads/{kv} groups" for q, kv in sorted(shapes))
        return f"the layers keep different numbers of heads ({found})"
    return shapes.pop()


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    shape = uniform_shape(cfg)
    if isinstance(shape, str):
        raise ProbeError(
            f"This pruned model cannot be written as a Hugging Face Llama: {shape}, but its "
            "config.json has one head count for every layer. Prune with `probe prune --uniform` "
            "(the same number of heads, or groups, in every layer) to make it exportable."
        )
    n_q, n_kv = shape
    weights = {hf: state[p] for hf, p in _names(cfg).items()}
    hf = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": n_q,
        "num_key_value_heads": n_kv,
        "head_dim": cfg.d_head,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.ln_eps,
        "rope_theta": cfg.rope_base,
        "attention_bias": bool(cfg.qkv_bias),
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
    }
    if cfg.qkv_bias:  # Llama's attention_bias also puts a bias on o_proj: zeros compute the same
        for i in range(cfg.n_layer):
            weights[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(cfg.d_model)
    return hf, weights
