"""OLMo-3: OLMo-2's model (probe.interop.hf_olmo2 reads and writes its block) with sliding
windows on the layers `layer_types` calls sliding_attention (absent: three of every four, each
fourth full; `sliding_window` 4096 when absent) and one rotary section per layer type
(`rope_parameters.full_attention` / `.sliding_attention`: the long-context models put YaRN on
the full layers only), as transformers 5.25 computes it. Each section's `rope_theta` defaults to
500000; a top-level `rope_theta` (and `rope_scaling`) reaches only the full layers' section, as
transformers' Olmo3Config fills them in.

A pruned OLMo-3 is written as OLMo-2 is: every head, the removed ones zero (`PRUNED_EXPORT`)."""

from __future__ import annotations

from dataclasses import replace

import torch

from probe.config import ModelConfig
from probe.interop import hf_olmo2
from probe.interop.family_parts import layer_types, windows
from probe.interop.fields import Fields
from probe.interop.hf_rope import read_rotary, rotary_to_hf
from probe.rope import UNSCALED

MODEL_TYPES = ("olmo3",)
IGNORED = hf_olmo2.IGNORED
PRUNED_EXPORT = (
    "OLMo-3's QK-norm normalises the queries and keys of every head together, so its config "
    "cannot hold fewer heads."
)
THETA = 500_000.0  # Olmo3Config's rotary base of both layer types
WINDOW = 4096  # Olmo3Config's sliding_window


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    block = hf_olmo2.keywords(hf, names, "OLMo-3")
    n_layer = block["n_layer"]
    types = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n_layer)]
    window, window_layers = windows(hf, n_layer, types, WINDOW)
    rotary = read_rotary(hf, block["max_len"], theta=THETA, local_theta=THETA, nested=True,
                         slides=window is not None)  # fmt: skip
    return ModelConfig(**block, **rotary, sliding_window=window, window_layers=window_layers)


to_probe = hf_olmo2.to_probe  # the same weight names


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """OLMo-2's config.json and weights with OLMo-3's `layer_types`, window and one rotary
    section per layer type."""
    block = replace(cfg, sliding_window=None, window_layers=None, rope_local_base=None,
                    rope_local_scaling=UNSCALED)  # fmt: skip
    hf, weights = hf_olmo2.to_hf(state, block)
    return {
        **hf,
        "model_type": "olmo3",
        "architectures": ["Olmo3ForCausalLM"],
        # transformers builds the sliding mask even where no layer uses it: any size will do
        "sliding_window": cfg.sliding_window or cfg.max_len,
        "layer_types": layer_types(cfg),
        "rope_parameters": rotary_to_hf(cfg, nested=True),
    }, weights
