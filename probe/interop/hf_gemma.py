"""Gemma family (Gemma, Gemma 2, Gemma 3's text model), as transformers 5.24 computes it.

All three: GeGLU with torch's tanh GELU, token embeddings times sqrt(hidden_size) rounded to the
weights' dtype, RMSNorm with gain 1 + w multiplied in float32 (probe stores w: `norm_offset`),
rotary embedding (rotate-half layout), `head_dim` independent of the width, grouped-query
attention, tied output. Gemma: pre-norm. Gemma 2: a norm before and after attention and FFN
(`Norm.SANDWICH`: input_layernorm / post_attention_layernorm / pre_feedforward_layernorm /
post_feedforward_layernorm are probe's ln_attn / ln_attn_out / ln_ffn / ln_ffn_out), scores
scaled by 1/sqrt(query_pre_attn_scalar), soft-capped attention and output logits, sliding-window
layers where `layer_types` says (transformers' one mask rule, probe.model.mask). Gemma 3: as
Gemma 2 with an RMSNorm (1 + w) on each head's q and k, one rotary per layer type (its own base
on the sliding layers; the 4B and larger scale the global ones linearly), and no attention
soft-capping (transformers 5.24 reads `attn_logit_softcapping` but never applies it, so neither
does probe). A multimodal Gemma 3 (`gemma3`) imports as its text model: `text_config` and the
language model's weights (the vision tower is left out), without the final soft-capping, which
transformers' Gemma3ForConditionalGeneration does not apply; it exports as `gemma3_text`.

Absent keys take the defaults of transformers' config classes (`DEFAULTS`), as a multimodal
Gemma 3's `text_config`, which lists few, needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import FFN, ModelConfig, Norm
from probe.errors import ProbeError
from probe.interop import hf_llama
from probe.interop.family_parts import (
    LLAMA_NORMS,
    gated,
    layer_types,
    llama_names,
    renamed,
    same_tied_head,
    tied_output,
    uniform_heads,
    windows,
)
from probe.interop.fields import Fields
from probe.interop.hf_rope import read_rotary, rotary_to_hf

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3")
# source tensors probe may leave unused: a tied lm_head, rotary frequencies of older files, and
# a multimodal Gemma 3's vision tower and projector
IGNORED = (r"(language_model\.)?lm_head\.weight", r".*rotary_emb\.inv_freq",
           r"(model\.)?(vision_tower|multi_modal_projector)\..*")  # fmt: skip

_COMMON = {"head_dim": 256, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
           "sliding_window": 4096, "rope_theta": 10000.0}  # fmt: skip
# transformers 5.24's config-class defaults of the keys probe reads
DEFAULTS = {
    "gemma": {**_COMMON, "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
              "max_position_embeddings": 8192},
    "gemma2": {**_COMMON, "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "max_position_embeddings": 8192, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "sliding_window_pattern": 2},
    "gemma3_text": {**_COMMON, "vocab_size": 262208, "hidden_size": 2304,
                    "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "max_position_embeddings": 131072,
                    "final_logit_softcapping": None, "sliding_window_pattern": 6,
                    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0},
}  # fmt: skip
# what every Gemma's block does otherwise than Llama's (probe.interop.hf_llama): GeGLU, token
# embeddings times sqrt(hidden_size), RMSNorm gain 1 + w multiplied in float32, no q/k/v biases
CHANGES = {"ffn": FFN.GEGLU, "embed_scale": True, "norm_offset": 1.0, "norm_gain_float32": True,
           "qkv_bias": False}  # fmt: skip
ARCHITECTURES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM"}  # fmt: skip


def _keys(kind: str) -> dict[str, str]:
    """Where the Gemma `kind`'s config names a shared key otherwise than Llama's: Gemma 2 and 3
    read their activation from `hidden_activation` (probe.interop.common)."""
    return {} if kind == "gemma" else {"hidden_act": "hidden_activation"}


def _rotary(hf: Fields, kind: str, context: int, slides: bool) -> dict:
    """The rotary ModelConfig keywords (probe.interop.hf_rope.read_rotary): Gemma and Gemma 2
    one section; Gemma 3 one per layer type, its global base from `rope_theta` and its local
    one from `rope_local_base_freq` where the sections do not say (`slides`: whether a layer
    slides to use it)."""
    d = DEFAULTS[kind]
    if kind != "gemma3_text":
        return read_rotary(hf, context, theta=d["rope_theta"])
    local = hf.number("rope_local_base_freq", d["rope_local_base_freq"])
    return read_rotary(hf, context, theta=d["rope_theta"], local_theta=local, nested=True,
                       slides=slides)  # fmt: skip


def _windows(hf: Fields, kind: str, n_layer: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(sliding_window, window_layers): the layers `layer_types` calls sliding_attention (absent:
    every layer but each `sliding_window_pattern`-th, Gemma 3; every other from the first,
    Gemma 2, as transformers fills them in)."""
    if kind == "gemma":
        return None, None
    pattern = DEFAULTS[kind]["sliding_window_pattern"]
    if kind == "gemma3_text":
        pattern = hf.integer("sliding_window_pattern", pattern)
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layer)]
    return windows(hf, n_layer, types, DEFAULTS[kind]["sliding_window"])


def _cap(hf: Fields, key: str, default: float | None) -> float | None:
    """A soft-capping value: absent means the class default, null means none."""
    if key in hf and hf.get(key) is None:
        return None
    return hf.number(key, default)


def _text(hf: Fields) -> Fields:
    """A multimodal Gemma 3's text model config (the vision tower is not imported)."""
    text = hf.section("text_config")
    kind = text.name("model_type", "gemma3_text")
    if kind != "gemma3_text":
        text.fail("model_type", "'gemma3_text' (the text model of a Gemma 3)", kind)
    return Fields({**text.data, "model_type": kind}, text.label, text.prefix)


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = top = Fields.of(hf, where)
    multimodal = hf.name("model_type") == "gemma3"
    if multimodal:
        hf = _text(hf)
        names = None if names is None else {_plain_name(n) for n in names}
    kind = hf.name("model_type")
    d = DEFAULTS[kind]
    gelu = ("gelu",) if kind == "gemma" else ()
    act_key = _keys(kind).get("hidden_act", "hidden_act")
    gated(hf, act_key, FFN.GEGLU, "Gemma's GeGLU (gelu is its tanh form)", aliases=gelu)
    if hf.flag("attention_bias", False):
        hf.refuse("attention_bias", True, "biases on the attention projections are not "
                  "implemented in probe's Gemma.")  # fmt: skip
    if hf.flag("use_bidirectional_attention", False):
        hf.refuse("use_bidirectional_attention", True, "bidirectional (non-causal) attention is "
                  "not implemented in probe's Gemma, a causal language model.")  # fmt: skip
    later = kind != "gemma"  # Gemma 2 and 3: a norm before and after each sub-layer
    block = {**hf_llama.keywords(hf, d), **CHANGES, "norm": Norm.SANDWICH if later else Norm.PRE}
    window, window_layers = _windows(hf, kind, block["n_layer"])
    capped = later and not multimodal  # Gemma3ForConditionalGeneration does not soft-cap
    return ModelConfig(
        **block,
        **_rotary(hf, kind, block["max_len"], slides=window is not None),
        tie_embeddings=tied_output(top, names, default=True),
        qk_norm=kind == "gemma3_text",
        scale_dim=hf.number("query_pre_attn_scalar", d["query_pre_attn_scalar"]) if later else None,
        attn_softcap=_cap(hf, "attn_logit_softcapping", 50.0) if kind == "gemma2" else None,
        final_softcap=_cap(hf, "final_logit_softcapping", d.get("final_logit_softcapping"))
        if capped
        else None,
        sliding_window=window,
        window_layers=window_layers,
    )


# where a multimodal Gemma 3 keeps its language model: transformers 5 and the older files
TEXT_PREFIXES = (("model.language_model.", "lm_head.weight"),
                 ("language_model.model.", "language_model.lm_head.weight"))  # fmt: skip


def _plain_name(name: str) -> str:
    """A multimodal Gemma 3's tensor name as the text model calls it."""
    for body, head in TEXT_PREFIXES:
        if name == head:
            return "lm_head.weight"
        if name.startswith(body):
            return "model." + name.removeprefix(body)
    return name


def _names(cfg: ModelConfig, body: str = "model.", head: str = "lm_head.weight") -> dict:
    """Hugging Face name -> probe name (`body`, `head`: where the text model's tensors are)."""
    norms = LLAMA_NORMS
    if cfg.norm == Norm.SANDWICH:  # Gemma 2 and 3: a norm before and after each sub-layer
        norms = {
            "input_layernorm": "ln_attn",
            "post_attention_layernorm": "ln_attn_out",
            "pre_feedforward_layernorm": "ln_ffn",
            "post_feedforward_layernorm": "ln_ffn_out",
        }
    return llama_names(cfg, norms, body=body, head=head)


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    body, head = "model.", "lm_head.weight"
    for prefix, lm_head in TEXT_PREFIXES:  # a multimodal Gemma 3
        if f"{prefix}embed_tokens.weight" in state:
            body, head = prefix, lm_head
    if cfg.tie_embeddings:
        same_tied_head(state, f"{body}embed_tokens.weight", head, where)
    yield from renamed(state, _names(cfg, body, head), where)


def _kind(cfg: ModelConfig) -> str:
    """The Gemma a probe config computes: pre-norm Gemma; Gemma 2 with sandwich norms; Gemma 3
    with QK-norm too."""
    if cfg.norm == Norm.PRE:
        return "gemma"
    return "gemma3_text" if cfg.qk_norm else "gemma2"


def _integral(x: float) -> float | int:
    """An integral number as an int (transformers' config classes type the key as one)."""
    return int(x) if float(x).is_integer() else x


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """Llama's config.json with Gemma's model type, activation and rotary sections, no MLP bias
    key, and Gemma 2 and 3's attention scale, windows and soft-capping."""
    kind = _kind(cfg)
    n_q, n_kv = uniform_heads(cfg, kind)
    if kind != "gemma" and cfg.d_model % n_q:  # transformers' config class checks it
        raise ProbeError(
            f"This pruned model keeps {n_q} heads per layer, but transformers' {kind} requires "
            f"hidden_size ({cfg.d_model}) to be a multiple of num_attention_heads; prune to a "
            "head count that divides it."
        )
    hf = hf_llama.written(cfg, (n_q, n_kv), "gelu_pytorch_tanh", _keys(kind))
    del hf["mlp_bias"]
    hf |= {"model_type": kind, "architectures": [ARCHITECTURES[kind]],
           "rope_parameters": rotary_to_hf(cfg, nested=kind == "gemma3_text"),
           "attention_bias": False}  # fmt: skip
    if kind != "gemma":
        hf |= {
            "query_pre_attn_scalar": _integral(cfg.scale_dim or cfg.d_head),
            # transformers builds the sliding mask even where no layer uses it: any size will do
            "sliding_window": cfg.sliding_window or cfg.max_len,
            "layer_types": layer_types(cfg),
            "final_logit_softcapping": cfg.final_softcap,
            "attn_logit_softcapping": cfg.attn_softcap,
        }
    return hf, {name: state[p] for name, p in _names(cfg).items()}
