"""OLMo-2 family: Llama's model (probe.interop.hf_llama reads and writes its block) with
RMSNorm on each sub-layer's output before the residual add (probe's norm "branch":
post_attention_layernorm and post_feedforward_layernorm) instead of on its input, its gain
multiplied in float32; QK-norm over the whole q and k projections (one RMSNorm over all heads'
queries, one over all keys); rotary embedding over each whole head rotated in float32 (rounded
once); no biases, untied output (`CHANGES`, `DEFAULTS`).

A pruned OLMo-2 keeps every q and k row (the norm's statistic of a kept head depends on the
removed heads); its config cannot hold fewer heads, so it is written at its unpruned size with
the removed heads zero (`PRUNED_EXPORT`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import FFN, ModelConfig, Norm
from probe.interop import hf_llama
from probe.interop.family_parts import (
    gated,
    llama_names,
    refuse_unimplemented,
    renamed,
    same_tied_head,
    tied_output,
)
from probe.interop.fields import Fields
from probe.interop.hf_neox import padded
from probe.interop.hf_rope import read_rotary

# OLMo-2's norms sit on each sub-layer's output (norm "branch")
OLMO2_NORMS = {"post_attention_layernorm": "ln_attn_out",
               "post_feedforward_layernorm": "ln_ffn_out"}  # fmt: skip
MODEL_TYPES = ("olmo2",)
# source tensors probe may leave unused: the rotary frequencies of older files, a tied lm_head
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")
# keys of other families OLMo-2 ignores (its rotary embedding spans each whole head)
OWN_KEYS = ("partial_rotary_factor",)
# a pruned model in transformers' OLMo-2: its QK-norm spans every head, so fewer heads cannot
# be written (probe keeps every q and k row for the same reason)
PRUNED_EXPORT = (
    "OLMo-2's QK-norm normalises the queries and keys of every head together, so its config "
    "cannot hold fewer heads."
)
DEFAULTS = {**hf_llama.DEFAULTS, "rms_norm_eps": 1e-5}  # Olmo2Config's, where Llama's differ
# what OLMo-2's block does otherwise than Llama's: norms on each sub-layer's output, their gain
# in float32, one QK-norm over all heads' queries and one over all keys, rotary in float32
CHANGES = {"norm": Norm.BRANCH, "norm_gain_float32": True, "qk_norm": True, "qk_norm_whole": True,
           "rope_float32": True}  # fmt: skip


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    block = keywords(hf, names)
    return ModelConfig(**block, **read_rotary(hf, block["max_len"]))


def keywords(hf: Fields, names: set[str] | None, family_name: str = "OLMo-2") -> dict:
    """The ModelConfig keywords of OLMo-2's model but its rotary (which OLMo-3 reads per layer
    type): Llama's block with `CHANGES`, errors naming `family_name`."""
    refuse_unimplemented(hf, family_name, OWN_KEYS)
    gated(hf, "hidden_act", FFN.SWIGLU, family_name)
    if hf.flag("attention_bias", False):
        hf.refuse("attention_bias", True, "biases on q, k, v and o are not implemented in "
                  f"probe's {family_name}.")  # fmt: skip
    block = {**hf_llama.keywords(hf, DEFAULTS), **CHANGES}
    return {**block, "tie_embeddings": tied_output(hf, names, default=False)}


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if cfg.tie_embeddings:
        same_tied_head(state, "model.embed_tokens.weight", "lm_head.weight", where)
    yield from renamed(state, llama_names(cfg, OLMO2_NORMS), where)


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """Llama's config.json with every head (a pruned model keeps every head's q and k rows, as
    its QK-norm spans them all, and is written with the removed heads' v rows and o columns
    zero: `PRUNED_EXPORT`), no MLP bias key, and head_dim only where transformers needs it."""
    hf = hf_llama.written(cfg, (cfg.n_head, cfg.kv_heads))
    del hf["mlp_bias"], hf["head_dim"]
    hf |= {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "attention_bias": False}
    if cfg.d_head * cfg.n_head != cfg.d_model:  # transformers reads head_dim when it is there
        hf["head_dim"] = cfg.d_head
    weights = {hf_name: state[p] for hf_name, p in llama_names(cfg, OLMO2_NORMS).items()}
    for site in cfg.sites():
        h, b = f"model.layers.{site.index}.self_attn.", f"{site.name}."
        weights[f"{h}v_proj.weight"] = padded(
            state[f"{b}v.weight"], site.kept_groups, cfg.kv_heads, cfg.d_head, 0
        )
        weights[f"{h}o_proj.weight"] = padded(
            state[f"{b}o.weight"], site.kept_heads, cfg.n_head, cfg.d_head, 1
        )
    return hf, weights
