"""OLMo-2 family: RMSNorm on each sub-layer's output before the residual add (probe's norm
"branch": post_attention_layernorm and post_feedforward_layernorm), its gain multiplied in
float32; QK-norm over the whole q and k projections (one RMSNorm over all heads' queries, one
over all keys), SwiGLU, rotary embedding over each whole head (rotated in float32, rounded
once), no biases, untied output.

A pruned OLMo-2 keeps every q and k row (the norm's statistic of a kept head depends on the
removed heads), so it has no Hugging Face OLMo-2 form: its export is refused."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import FFN, PE, Arch, ModelConfig, Norm, NormType
from probe.interop.families import (
    llama_names,
    refuse_unimplemented,
    renamed,
    same_tied_head,
    tied_output,
)
from probe.interop.fields import Fields
from probe.interop.hf_neox import padded
from probe.interop.hf_rope import read_rotary, rotary_to_hf

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


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    block = keywords(hf, names)
    return ModelConfig(**block, **read_rotary(hf, block["max_len"]))


def keywords(hf: Fields, names: set[str] | None, family_name: str = "OLMo-2") -> dict:
    """The ModelConfig keywords of OLMo-2's model but its rotary (which OLMo-3 reads per layer
    type), errors naming `family_name`."""
    refuse_unimplemented(Fields({k: v for k, v in hf.data.items() if k not in OWN_KEYS},
                                hf.label), family_name)  # fmt: skip
    hf.choice("hidden_act", "silu", ("silu",), family_name)
    if hf.flag("attention_bias", False):
        hf.refuse("attention_bias", True, "biases on q, k, v and o are not implemented in "
                  f"probe's {family_name}.")  # fmt: skip
    d_model = hf.integer("hidden_size")
    n_head = hf.integer("num_attention_heads")
    n_kv_head = hf.integer("num_key_value_heads", n_head)
    if hf.has("num_key_value_heads"):
        hf.divides("num_attention_heads", "num_key_value_heads")
    if not hf.has("head_dim"):
        hf.divides("hidden_size", "num_attention_heads")
    return dict(
        arch=Arch.DECODER,
        vocab_size=hf.integer("vocab_size"),
        n_layer=hf.integer("num_hidden_layers"),
        n_head=n_head,
        n_kv_head=n_kv_head,
        d_model=d_model,
        d_head=hf.integer("head_dim", d_model // n_head),
        ffn=FFN.SWIGLU,
        ffn_mult=hf.integer("intermediate_size") / d_model,
        norm=Norm.BRANCH,
        norm_type=NormType.RMS,
        norm_gain_float32=True,
        qk_norm=True,
        qk_norm_whole=True,
        pe=PE.ROPE,
        rope_float32=True,
        max_len=hf.integer("max_position_embeddings", 2048),
        bias=False,
        tie_embeddings=tied_output(hf, names, default=False),
        ln_eps=hf.number("rms_norm_eps", 1e-5),
    )


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if cfg.tie_embeddings:
        same_tied_head(state, "model.embed_tokens.weight", "lm_head.weight", where)
    yield from renamed(state, llama_names(cfg, OLMO2_NORMS), where)


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """A pruned model keeps every head's q and k rows (its QK-norm spans them all), and is
    written with the removed heads' v rows and o columns zero (`PRUNED_EXPORT`)."""
    hf = {
        "model_type": "olmo2",
        "architectures": ["Olmo2ForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.ln_eps,
        "rope_parameters": rotary_to_hf(cfg),
        "attention_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
    }
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
