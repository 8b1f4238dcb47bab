"""A llama.cpp GGUF file's metadata -> the Hugging Face config.json dict of the same model, one
function per architecture (`general.architecture`), each undoing what llama.cpp's
`convert_hf_to_gguf.py` wrote for that architecture.

Every key is read through `Fields` under the architecture's prefix (`qwen3.embedding_length`);
a value that asks for something probe does not compute (experts, a second rotary base where
Hugging Face has one, a rotary scaling llama.cpp has and transformers lacks) is refused in one
line naming the key. Rotary scaling (linear, yarn; llama3 from `rope_freqs.weight`, Phi-3's
longrope from its factor tensors) becomes the config's `rope_parameters` (`gguf_rope`). What
the converter drops, these functions rebuild as llama.cpp itself does at load time
(`llama-model.cpp`): Gemma 2/3's `query_pre_attn_scalar` from the model size, Gemma 3's local
rotary base and layer pattern.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from probe.errors import ProbeError
from probe.interop.gguf_meta import Meta
from probe.interop.gguf_rope import llama3_section, longrope_section, read_section


def float32_value(value: float) -> float:
    """The shortest decimal that a float32 stores: 1e-5 comes back as 1e-05, not 9.9999997e-06."""
    return float(str(np.float32(value)))


# Metadata that changes the function computed -> (the values that compute what probe computes,
# the feature): set otherwise, the file is refused.
_UNIMPLEMENTED = {
    "expert_count": ((0,), "mixture-of-experts layers"),
    "expert_used_count": ((0,), "mixture-of-experts layers"),
}


def llama(meta: Meta) -> dict[str, Any]:
    """A `LlamaConfig` dict (probe's first GGUF architecture: its vocabulary size is the
    metadata's, else the token list's, and its rotary scaling may be llama3's frequencies)."""
    config = _common(meta)
    tokens = meta.fields.get("tokenizer.ggml.tokens")
    if not meta.has("vocab_size") and not (isinstance(tokens, list) and tokens):
        raise ProbeError(f"GGUF file '{meta.path}' has neither 'llama.vocab_size' nor a token list")
    vocab_size = meta.count("vocab_size", len(tokens) if isinstance(tokens, list) else None)
    rope = _rope(meta, config["head_dim"], freqs=True)
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, **config, "vocab_size": vocab_size,
            "rope_theta": rope["rope_theta"], "rope_parameters": rope}  # fmt: skip


def _common(meta: Meta, rms: bool = True) -> dict[str, Any]:
    """The keys every decoder shares: sizes, heads, context, tying, special tokens; rotary
    scaling and experts refused. `rms`: the norm epsilon is an RMSNorm's (else a LayerNorm's)."""
    fields = meta.fields
    d_model, n_head = meta.count("embedding_length"), meta.count("attention.head_count")
    n_kv_head = meta.count("attention.head_count_kv", n_head)
    fields.divides(meta.key("attention.head_count"), n_head,
                   meta.key("attention.head_count_kv"), n_kv_head)  # fmt: skip
    if not meta.has("attention.key_length"):
        fields.divides(meta.key("embedding_length"), d_model,
                       meta.key("attention.head_count"), n_head)  # fmt: skip
    d_head = meta.count("attention.key_length", d_model // n_head)
    if meta.count("attention.value_length", d_head) != d_head:
        meta.refuse("attention.value_length", f"probe imports heads whose keys and values "
                    f"have one size (key length {d_head}).")  # fmt: skip
    for name, (neutral, feature) in _UNIMPLEMENTED.items():
        if meta.has(name) and fields.raw(meta.key(name)) not in neutral:
            meta.refuse(name, f"{feature} is not implemented in probe.")
    if "token_embd.weight" not in meta.shapes:
        raise ProbeError(f"GGUF file '{meta.path}' lacks the tensor 'token_embd.weight'")
    eps_key = "attention.layer_norm_rms_epsilon" if rms else "attention.layer_norm_epsilon"
    config: dict[str, Any] = {
        "vocab_size": meta.shapes["token_embd.weight"][0],
        "hidden_size": d_model,
        "intermediate_size": meta.count("feed_forward_length"),
        "num_hidden_layers": meta.count("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": d_head,
        "rms_norm_eps" if rms else "layer_norm_eps": float32_value(meta.number(eps_key)),
        "max_position_embeddings": meta.count("context_length"),
        "tie_word_embeddings": "output.weight" not in meta.shapes,
        "torch_dtype": "float32",
    }
    for token in ("bos", "eos", "pad"):
        key = f"tokenizer.ggml.{'padding' if token == 'pad' else token}_token_id"
        if fields.has(key):
            config[f"{token}_token_id"] = fields.integer(key, lo=0)
    return config


def _rope(meta: Meta, d_head: int, partial: bool = False, **scaling: bool) -> dict[str, Any]:
    """`rope_parameters` of the file's rotary base, for heads of `d_head`; `partial`: rotary
    dimensions may be fewer than a head's (as `partial_rotary_factor`), else they are all of it;
    `scaling`: the scalings besides linear and yarn the file may hold (`_scaled`'s flags)."""
    dims = meta.count("rope.dimension_count", d_head)
    factor = dims / d_head
    exact = int(d_head * factor) == dims and (partial or dims == d_head)
    if dims % 2 or dims > d_head or not exact:
        if not meta.has("rope.dimension_count"):  # all of a head of an odd size
            raise ProbeError(f"GGUF file '{meta.path}': the heads have {d_head} dimensions, an odd "
                             "number, which probe's rotary embedding cannot rotate.")  # fmt: skip
        meta.refuse("rope.dimension_count", f"probe rotates an even number of dimensions, "
                    f"{'at most' if partial else 'all'} of a head's {d_head}.")  # fmt: skip
    theta = meta.number("rope.freq_base", 10000.0)
    if not theta > 1:
        meta.fields.fail(meta.key("rope.freq_base"), "a number greater than 1 (usually 10000)",
                         theta)  # fmt: skip
    rope = {"rope_type": "default", "rope_theta": float32_value(theta)}
    if partial:
        rope["partial_rotary_factor"] = factor
    return _scaled(meta, rope, dims, meta.count("context_length"), **scaling)


def _scaled(meta: Meta, rope: dict[str, Any], dims: int, context: int, freqs: bool = False,
            longrope: bool = False) -> dict[str, Any]:  # fmt: skip
    """`rope` (a plain section) with the file's rotary scaling: linear or yarn metadata, or
    (`freqs`: llama) llama3's `rope_freqs.weight`; `longrope`: Phi-3, whose factor tensors and
    attention factor `phi3` reads."""
    section = read_section(meta, context, longrope)
    if freqs and "rope_freqs.weight" in meta.shapes:
        if section:
            meta.refuse("rope.scaling.type", "a file with rope_freqs.weight (llama3 scaling) "
                        "has no other rotary scaling.")  # fmt: skip
        section = llama3_section(meta, "rope_freqs.weight", dims, rope["rope_theta"])
    return {**rope, **section}


def _no_sliding_window(meta: Meta, what: str) -> None:
    if meta.count("attention.sliding_window", 0, lo=0):
        meta.refuse(
            "attention.sliding_window",
            f"sliding-window layers ({what}) are not "
            "part of this architecture in Hugging Face; probe cannot import them.",
        )


def _llama_like(meta: Meta, model_type: str, architecture: str, windowed: str) -> dict[str, Any]:
    """A config of Llama's keys for `model_type`, refusing the sliding window of `windowed`
    (the model a window would make it)."""
    config = _common(meta)
    config["rope_parameters"] = _rope(meta, config["head_dim"])
    _no_sliding_window(meta, windowed)
    return {"model_type": model_type, "architectures": [architecture], "hidden_act": "silu",
            "attention_bias": False, **config}  # fmt: skip


def qwen3(meta: Meta) -> dict[str, Any]:
    return _llama_like(meta, "qwen3", "Qwen3ForCausalLM", "Qwen3 with use_sliding_window")


def olmo2(meta: Meta) -> dict[str, Any]:
    return _llama_like(meta, "olmo2", "Olmo2ForCausalLM", "OLMo 3")


def phi3(meta: Meta) -> dict[str, Any]:
    config = _common(meta)
    d_head = config.pop("head_dim")  # Phi-3's config derives it
    if d_head * config["num_attention_heads"] != config["hidden_size"]:
        meta.refuse("attention.key_length", "Phi-3 heads are embedding_length / head_count wide.")
    rope = _rope(meta, d_head, partial=True, longrope=True)
    original = meta.count("rope.scaling.original_context_length", config["max_position_embeddings"])
    dims = round(d_head * rope["partial_rotary_factor"])
    rope |= longrope_section(meta, dims, config["max_position_embeddings"], original)
    config["rope_parameters"] = rope
    window = meta.count("attention.sliding_window", 0, lo=0)
    return {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_act": "silu",
            **config, "original_max_position_embeddings": original,
            "sliding_window": window or None}  # fmt: skip


def gptneox(meta: Meta) -> dict[str, Any]:
    config = _common(meta, rms=False)
    if config["num_key_value_heads"] != config["num_attention_heads"]:
        meta.refuse("attention.head_count_kv", "GPT-NeoX has one key/value head per query head.")
    config["rope_parameters"] = _rope(meta, config["head_dim"], partial=True)
    for key in ("head_dim", "num_key_value_heads"):  # GPT-NeoX's config derives them
        del config[key]
    return {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
            "hidden_act": "gelu", "use_parallel_residual": meta.flag("use_parallel_residual", True),
            "attention_bias": "blk.0.attn_qkv.bias" in meta.shapes, **config}  # fmt: skip


def _gemma_base(meta: Meta, model_type: str, architecture: str) -> dict[str, Any]:
    config = _common(meta)
    act = "hidden_act" if model_type == "gemma" else "hidden_activation"
    return {"model_type": model_type, "architectures": [architecture], act: "gelu_pytorch_tanh",
            "attention_bias": False, **config}  # fmt: skip


def _layer_types(meta: Meta, n_layer: int, period: int) -> list[str]:
    """llama.cpp's sliding-window pattern: a period n (each n-th layer global) or one flag per
    layer (true: sliding), from `attention.sliding_window_pattern` when the file has it."""
    pattern = meta.fields.raw(meta.key("attention.sliding_window_pattern"), period)
    if (
        isinstance(pattern, list)
        and len(pattern) == n_layer
        and all(isinstance(p, bool) for p in pattern)
    ):
        return ["sliding_attention" if p else "full_attention" for p in pattern]
    period = meta.count("attention.sliding_window_pattern", period)
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n_layer)]


def _query_scalar(config: dict[str, Any], large_n_layer: int) -> int:
    """llama.cpp's Gemma attention scale: 1/sqrt(d_model / n_head) for the 27B models (known by
    their layer count), else 1/sqrt(head_dim); the converter does not store it."""
    if config["num_hidden_layers"] == large_n_layer:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def gemma(meta: Meta) -> dict[str, Any]:
    config = _gemma_base(meta, "gemma", "GemmaForCausalLM")
    config["rope_parameters"] = _rope(meta, config["head_dim"])
    return config


def gemma2(meta: Meta) -> dict[str, Any]:
    config = _gemma_base(meta, "gemma2", "Gemma2ForCausalLM")
    rope = _rope(meta, config["head_dim"])
    if meta.has("rope.freq_base_swa") and meta.number("rope.freq_base_swa") != meta.number(
        "rope.freq_base", 10000.0
    ):
        meta.refuse("rope.freq_base_swa", "Gemma 2 has one rotary base for all layers.")
    n_layer = config["num_hidden_layers"]
    return {**config, "rope_parameters": rope,
            "query_pre_attn_scalar": _query_scalar(config, 46),
            "sliding_window": meta.count("attention.sliding_window", 4096),
            "layer_types": _layer_types(meta, n_layer, 2),
            "attn_logit_softcapping": float32_value(meta.number("attn_logit_softcapping", 50.0)),
            "final_logit_softcapping": float32_value(meta.number("final_logit_softcapping", 30.0)),
            }  # fmt: skip


def gemma3(meta: Meta) -> dict[str, Any]:
    config = _gemma_base(meta, "gemma3_text", "Gemma3ForCausalLM")
    full = _rope(meta, config["head_dim"])  # llama.cpp scales the global layers only
    local = {
        "rope_type": "default",
        "rope_theta": float32_value(meta.number("rope.freq_base_swa", 10000.0)),
    }
    n_layer, window = config["num_hidden_layers"], meta.count("attention.sliding_window", 0, lo=0)
    layer_types = _layer_types(meta, n_layer, 6) if window else ["full_attention"] * n_layer
    softcap = meta.number("final_logit_softcapping", None)
    return {**config, "rope_parameters": {"full_attention": full, "sliding_attention": local},
            "query_pre_attn_scalar": _query_scalar(config, 62),
            "sliding_window": window or None, "layer_types": layer_types,
            "final_logit_softcapping": None if softcap is None else float32_value(softcap),
            "attn_logit_softcapping": None}  # fmt: skip


CONFIGS: dict[str, Callable[[Meta], dict[str, Any]]] = {
    "llama": llama,
    "qwen3": qwen3,
    "gemma": gemma,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "phi3": phi3,
    "olmo2": olmo2,
    "gptneox": gptneox,
}
