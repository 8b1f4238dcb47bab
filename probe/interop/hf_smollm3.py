"""SmolLM3: a Llama (probe.interop.hf_llama reads and writes its block: q/k/v/o biases with
`attention_bias`, MLP biases refused) whose layers `no_rope_layers` flags 0 use no rotary
(`nope_layers`; absent: every `no_rope_layer_interval`-th layer, 4 by default), with sliding
windows on the layers `layer_types` calls sliding_attention. As transformers 5.25 computes it:
the mask of a layer follows `layer_types` (eager and sdpa attention), `use_sliding_window` only
chooses the default `layer_types` (the layers without rotary slide when it is true and
`sliding_window` is set) and flash-attention's window; the config class's defaults differ from
Llama's (`DEFAULTS`)."""

from __future__ import annotations

from dataclasses import replace

import torch

from probe.config import ModelConfig
from probe.interop import hf_llama
from probe.interop.family_parts import layer_types, windows
from probe.interop.fields import Fields

MODEL_TYPES = ("smollm3",)
IGNORED = hf_llama.IGNORED
# transformers 5.25's SmolLM3Config defaults where they differ from what hf_llama assumes
DEFAULTS = {"rope_theta": 2_000_000.0, "tie_word_embeddings": True, "num_key_value_heads": 4,
            "max_position_embeddings": 32768}  # fmt: skip
# SmolLM3Config's token ids: an export whose vocabulary they fall outside sets them to none
# (transformers refuses a padding id outside the vocabulary)
TOKEN_IDS = {"pad_token_id": 128004, "bos_token_id": 128000, "eos_token_id": 128001}


def _rotary_layers(hf: Fields, n_layer: int) -> list[int]:
    """`no_rope_layers` (1: the layer rotates, 0: it does not), at least one flag per layer as
    transformers reads it; absent: 0 on every `no_rope_layer_interval`-th layer."""
    flags = hf.raw("no_rope_layers")
    if flags is None:
        every = hf.integer("no_rope_layer_interval", 4)
        return [int((i + 1) % every != 0) for i in range(n_layer)]
    valid = isinstance(flags, list) and all(type(f) is int and f in (0, 1) for f in flags)
    if not valid or len(flags) < n_layer:
        hf.fail("no_rope_layers", f"a list of {n_layer} flags 0 or 1 (1: the layer uses "
                "rotary)", flags)  # fmt: skip
    return flags[:n_layer]


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    cfg = hf_llama.config(Fields({**DEFAULTS, **hf.data, "model_type": "llama"}, hf.label),
                          where, names)  # fmt: skip
    rotary = _rotary_layers(hf, cfg.n_layer)
    slides = hf.flag("use_sliding_window", False) and hf.has("sliding_window")
    types = ["sliding_attention" if slides and not r else "full_attention" for r in rotary]
    window, window_layers = windows(hf, cfg.n_layer, types, None)
    nope = tuple(i for i, r in enumerate(rotary) if not r)
    return replace(cfg, nope_layers=nope or None, sliding_window=window,
                   window_layers=window_layers)  # fmt: skip


to_probe = hf_llama.to_probe  # the same weight names (o_proj's bias checked to be zero)


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """Llama's config.json and weights (every layer rotating, no window) with SmolLM3's
    `no_rope_layers`, `layer_types` and window."""
    block = replace(cfg, nope_layers=None, sliding_window=None, window_layers=None)
    hf, weights = hf_llama.to_hf(state, block, "SmolLM3")
    nope = cfg.nope_layers or ()
    return {
        **hf,
        "model_type": "smollm3",
        "architectures": ["SmolLM3ForCausalLM"],
        "no_rope_layers": [int(i not in nope) for i in range(cfg.n_layer)],
        "use_sliding_window": cfg.sliding_window is not None,
        "sliding_window": cfg.sliding_window,
        **{key: None for key, token in TOKEN_IDS.items() if token >= cfg.vocab_size},
        "layer_types": layer_types(cfg),
    }, weights
