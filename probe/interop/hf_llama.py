"""Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM): pre-norm RMSNorm, SwiGLU, rotary position
embedding with the config's base (rotate-half layout, as probe's `Rotary`), no biases (Qwen2:
biases on q, k and v), tied or untied output, grouped-query attention, the sliding windows of
Mistral, Qwen2 and Qwen3 (`_window`), and Qwen3's RMSNorm on each head's q and k (`qk_norm`,
`head_dim` 128 unless the config says otherwise).

The parent of the other Llama-derived families (OLMo-2, Phi-3, Gemma, SmolLM3), which state
only their differences from its block: `keywords` reads it, `written` writes its config.json."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from probe.config import FFN, PE, Arch, ModelConfig, Norm, NormType
from probe.errors import ProbeError
from probe.interop import common
from probe.interop.family_parts import (
    gated,
    layer_types,
    llama_names,
    refuse_unimplemented,
    renamed,
    same_tied_head,
    tied_output,
    uniform_heads,
    windows,
)
from probe.interop.fields import Fields
from probe.interop.hf_rope import read_rotary, rotary_to_hf

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# source tensors probe may leave unused: the rotary frequencies of older files, a tied lm_head,
# o_proj's bias (Llama's attention_bias; checked to be zero in `to_probe`)
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight",
           r"model\.layers\.\d+\.self_attn\.o_proj\.bias")  # fmt: skip
# LlamaConfig's values of the shared keys a config may leave out (probe.interop.common.read)
DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
# the Llama block as ModelConfig keywords: pre-norm RMSNorm, SwiGLU, rotary, no biases
BLOCK = {"arch": Arch.DECODER, "ffn": FFN.SWIGLU, "norm": Norm.PRE, "norm_type": NormType.RMS,
         "pe": PE.ROPE, "bias": False}  # fmt: skip


def rope(
    hf: Fields,
    context: int,
    family_name: str = "Llama family",
    partial: bool = False,
    **how: Any,
) -> dict[str, Any]:
    """The rotary ModelConfig keywords (base, scaling, rotated fraction) of a config whose model
    has `context` positions (probe.interop.hf_rope.read_rotary, which `how` is passed to); a
    partial rotary is refused unless the family has one (`partial`, Phi-3:
    `partial_rotary_factor` in the rotary section, else at the top level)."""
    fraction = hf.number("partial_rotary_factor", 1.0) if partial else 1.0
    section = hf.section("rope_scaling")
    if not section.data:
        section = hf.section("rope_parameters")
    factor = section.raw("partial_rotary_factor")
    if partial:
        fraction = section.number("partial_rotary_factor", fraction)
    elif factor is not None and section.number("partial_rotary_factor") != 1.0:
        section.refuse("partial_rotary_factor", factor, "rotary embedding on part of each "
                       f"head is not implemented in probe's {family_name}.")  # fmt: skip
    if not fraction <= 1:
        hf.fail("partial_rotary_factor", "a number in (0, 1]", fraction)
    return {**read_rotary(hf, context, partial=True, **how), "rope_fraction": fraction}


def _window(hf: Fields) -> tuple[int | None, tuple[int, ...] | None]:
    """(sliding_window, window_layers) as transformers 5.24 reads them: Mistral windows every
    layer (`sliding_window`, 4096 when absent, null for none); Qwen2 only with
    `use_sliding_window`, on the layers `layer_types` marks "sliding_attention" (absent: those
    from `max_window_layers` on, 28 by default), and Qwen3 alike; Llama has no window."""
    kind = hf.name("model_type")
    qwen = kind in ("qwen2", "qwen3")
    if kind == "llama" or (qwen and not hf.flag("use_sliding_window", False)):
        return None, None
    if "sliding_window" in hf and hf.get("sliding_window") is None:
        return None, None
    window = hf.integer("sliding_window", 4096)
    if not qwen:
        return window, None
    n_layer = hf.integer("num_hidden_layers")
    types: list[str] = []  # the config's `layer_types` where it has them
    if hf.raw("layer_types") is None:
        first = hf.integer("max_window_layers", 28, lo=0)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layer)]
    return windows(hf, n_layer, types, window)


def keywords(hf: Fields, defaults: Mapping[str, Any] = DEFAULTS) -> dict[str, Any]:
    """The ModelConfig keywords of a Llama block (`BLOCK`) of `hf`'s sizes (absent keys:
    `defaults`); its rotary, biases, output and windows are the family's to read."""
    return {**BLOCK, **common.read(hf, defaults)}


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    model_type = hf.name("model_type")
    refuse_unimplemented(hf, "Llama family")
    gated(hf, "hidden_act", FFN.SWIGLU, "the Llama family")
    llama = model_type == "llama"  # Mistral and Qwen2 have neither flag: transformers ignores it
    if llama and hf.flag("mlp_bias", False):
        hf.refuse("mlp_bias", True, "biases in the MLP are not implemented in probe's Llama.")
    qwen3 = model_type == "qwen3"  # Qwen3: attention_bias too, and always a norm on q and k
    biased = (llama or qwen3) and hf.flag("attention_bias", False)
    block = keywords(hf, {**DEFAULTS, "head_dim": 128} if qwen3 else DEFAULTS)
    window, window_layers = _window(hf)
    return ModelConfig(
        **block,
        **rope(hf, block["max_len"]),
        qkv_bias=model_type == "qwen2" or biased,
        tie_embeddings=tied_output(hf, names, default=False),
        qk_norm=qwen3,
        sliding_window=window,
        window_layers=window_layers,
    )


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if cfg.tie_embeddings:
        same_tied_head(state, "model.embed_tokens.weight", "lm_head.weight", where)
    for i in range(cfg.n_layer):  # probe's export writes zeros there: they compute the same
        bias = state.get(f"model.layers.{i}.self_attn.o_proj.bias")
        if bias is None or bias.is_meta:  # (a header pass: the values are checked when read)
            continue
        if bool(bias.to(torch.float32).abs().sum() > 0):
            raise ProbeError(
                f"{where}: attention_bias puts a non-zero bias on o_proj "
                f"(model.layers.{i}.self_attn.o_proj.bias); a bias there is not implemented in "
                "probe's Llama (q, k and v biases are)."
            )
    yield from renamed(state, llama_names(cfg), where)


def written(
    cfg: ModelConfig,
    heads: tuple[int, int],
    act: str = "silu",
    keys: Mapping[str, str] = common.NONE,
) -> dict[str, Any]:
    """Llama's config.json of `cfg` with `heads` (query heads, key/value heads) in every layer,
    the activation `act` and the family's `keys` (probe.interop.common.write)."""
    hf = common.write(cfg, "llama", "LlamaForCausalLM", act, heads, keys)
    return {
        **hf,
        "rope_parameters": rotary_to_hf(cfg),
        "attention_bias": bool(cfg.qkv_bias),
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
    }


def to_hf(
    state: dict[str, torch.Tensor], cfg: ModelConfig, family_name: str = "Llama"
) -> tuple[dict, dict]:
    hf = written(cfg, uniform_heads(cfg, family_name))
    weights = {name: state[p] for name, p in llama_names(cfg).items()}
    if cfg.qk_norm:
        return _qwen3(hf, weights, cfg)
    if cfg.sliding_window is not None:
        return _windowed(hf, weights, cfg)
    _zero_o_bias(weights, cfg)
    return hf, weights


def _zero_o_bias(weights: dict, cfg: ModelConfig) -> None:
    """attention_bias (Llama, Qwen3) also puts a bias on o_proj: zeros compute the same."""
    if cfg.qkv_bias:
        for i in range(cfg.n_layer):
            weights[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(cfg.d_model)


def _qwen3(hf: dict, weights: dict, cfg: ModelConfig) -> tuple[dict, dict]:
    """A norm on each head's q and k is a Qwen3 (a Llama config cannot hold it), its windowed
    layers named by `layer_types`, read back by `_window`."""
    del hf["mlp_bias"]
    types = layer_types(cfg)
    window = cfg.sliding_window
    _zero_o_bias(weights, cfg)
    return {
        **hf,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "use_sliding_window": window is not None,
        "sliding_window": window,
        "max_window_layers": types.index("sliding_attention") if window else cfg.n_layer,
        "layer_types": types,
    }, weights


def _windowed(hf: dict, weights: dict, cfg: ModelConfig) -> tuple[dict, dict]:
    """Llama has no sliding window: a window on every layer without q/k/v biases is a Mistral,
    any other a Qwen2 whose `layer_types` name the windowed layers (zero q/k/v biases where the
    model has none), read back by `_window`."""
    del hf["attention_bias"], hf["mlp_bias"]
    if cfg.window_layers is None and not cfg.qkv_bias:
        model_type = {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}
        return {**hf, **model_type, "sliding_window": cfg.sliding_window}, weights
    types = layer_types(cfg)
    hf = {
        **hf,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "use_sliding_window": True,
        "sliding_window": cfg.sliding_window,
        "max_window_layers": types.index("sliding_attention"),
        "layer_types": types,
    }
    if not cfg.qkv_bias:
        for name in [
            n for n in weights if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))
        ]:
            weights[name.removesuffix("weight") + "bias"] = torch.zeros(weights[name].shape[0])
    return hf, weights
