"""The settings every family's config.json holds, read once (`read`) and written once (`write`):
the vocabulary, the width, the layers, the FFN width, the heads (query heads; with grouped-query
attention also key/value heads and the head size), the context length and the norm epsilon.

Keys are LlamaConfig's. A family that names one otherwise says so in `keys`, as a transformers
config class's `attribute_map` does (GPT-2: `n_embd` for `hidden_size`; a LayerNorm's
`layer_norm_eps` for `rms_norm_eps`), and gives the values its config class fills in for absent
keys in `defaults` (a key without one is required). The activation's name is written here and
read by the family, which knows which it computes. A family module reads these here and states
only what its model does otherwise, as transformers' `modular_*.py` files do."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from probe.config import ModelConfig
from probe.interop.fields import REQUIRED, Fields

NONE: Mapping[str, Any] = MappingProxyType({})  # no renamed keys, no defaults


def read(
    hf: Fields,
    defaults: Mapping[str, Any] = NONE,
    keys: Mapping[str, str] = NONE,
    grouped: bool = True,
) -> dict[str, Any]:
    """ModelConfig keywords of the shared settings: d_model, n_head, vocab_size, n_layer,
    ffn_mult, max_len, ln_eps, and with `grouped` (a family with grouped-query attention)
    n_kv_head (absent: one per query head, which must divide them) and d_head (absent: the
    family's default, else hidden_size / num_attention_heads, which must divide); without it
    the heads are hidden_size / num_attention_heads wide."""

    def key(name: str) -> str:
        return keys.get(name, name)

    def integer(name: str, default: Any = REQUIRED) -> int:
        return hf.integer(key(name), defaults.get(name, default))

    d_model, n_head = integer("hidden_size"), integer("num_attention_heads")
    sizes: dict[str, Any] = {"d_model": d_model, "n_head": n_head}
    if grouped:
        n_kv_head = integer("num_key_value_heads", n_head)  # read first: 0 is refused by name
        hf.divides(key("num_attention_heads"), n_head, key("num_key_value_heads"), n_kv_head)
        sizes["n_kv_head"] = n_kv_head
    head_dim = defaults.get("head_dim") if grouped else None
    if not (grouped and hf.has("head_dim")) and head_dim is None:
        hf.divides(key("hidden_size"), d_model, key("num_attention_heads"), n_head)
    if grouped:
        sizes["d_head"] = hf.integer("head_dim", head_dim or d_model // n_head)
    return {
        **sizes,
        "vocab_size": integer("vocab_size"),
        "n_layer": integer("num_hidden_layers"),
        "ffn_mult": integer("intermediate_size") / d_model,
        "max_len": integer("max_position_embeddings"),
        "ln_eps": hf.number(key("rms_norm_eps"), defaults.get("rms_norm_eps", REQUIRED)),
    }


def write(
    cfg: ModelConfig,
    model_type: str,
    architecture: str,
    act: str,
    heads: tuple[int, int] | None = None,
    keys: Mapping[str, str] = NONE,
) -> dict[str, Any]:
    """The start of a config.json for `cfg`: its model type and architecture, the shared
    settings under the family's `keys`, and its activation's name `act` (as `hidden_act`);
    `heads`: the (query heads, key/value heads) of a family with grouped-query attention,
    written with its head_dim; without it the heads are cfg.n_head of hidden_size /
    num_attention_heads."""

    def key(name: str) -> str:
        return keys.get(name, name)

    config = {
        "model_type": model_type,
        "architectures": [architecture],
        key("vocab_size"): cfg.vocab_size,
        key("hidden_size"): cfg.d_model,
        key("intermediate_size"): cfg.d_ff,
        key("num_hidden_layers"): cfg.n_layer,
        key("num_attention_heads"): cfg.n_head if heads is None else heads[0],
    }
    if heads is not None:
        config |= {"num_key_value_heads": heads[1], "head_dim": cfg.d_head}
    return {
        **config,
        key("hidden_act"): act,
        key("max_position_embeddings"): cfg.max_len,
        key("rms_norm_eps"): cfg.ln_eps,
    }
