"""GPT-NeoX family (Pythia, GPT-NeoX-20B): LayerNorm with biases, attention and FFN in parallel
on the same input (`use_parallel_residual`; else sequential pre-norm), rotary embedding on the
first `rotary_pct` of each head's dimensions (rotate-half layout, as probe's `Rotary`), the
fused `query_key_value` projection whose rows are per head [q | k | v] (split here, re-fused on
export), biases on every linear layer, exact GELU, untied output `embed_out`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from probe.config import PE, Arch, ModelConfig, Norm
from probe.errors import ProbeError
from probe.interop import common
from probe.interop.family_parts import (
    ACTIVATIONS,
    EXPORTED,
    refuse_unimplemented,
    renamed,
    require,
    same_tied_head,
)
from probe.interop.fields import Fields
from probe.interop.hf_rope import read_rotary, rotary_to_hf

MODEL_TYPES = ("gpt_neox",)
# source tensors probe may leave unused: the causal-mask and rotary buffers of older files, an
# output layer tied to embed_in
IGNORED = (r"gpt_neox\.layers\.\d+\.attention\.(masked_)?bias",
           r"gpt_neox\.layers\.\d+\.attention\.rotary_emb\.inv_freq",
           r"embed_out\.weight", r"lm_head\.weight")  # fmt: skip
# keys of other families GPT-NeoX reads otherwise (its rotary fraction) or ignores (always causal)
OWN_KEYS = ("partial_rotary_factor", "is_decoder")
# GPTNeoXConfig's name and default of the shared keys it names or fills in otherwise than Llama's
KEYS = {"rms_norm_eps": "layer_norm_eps"}  # a LayerNorm's epsilon
DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5}
HEADS = (
    "embed_out.weight",
    "lm_head.weight",
)  # the output layer: as saved, as transformers 5 names
# a pruned model in transformers' GPT-NeoX: its config has no head size (it is hidden_size /
# num_attention_heads), so fewer heads cannot be written
PRUNED_EXPORT = "a GPT-NeoX config has no head size (it is hidden_size / num_attention_heads)."


def _rotary(hf: Fields, d_head: int, context: int) -> dict[str, Any]:
    """The rotary ModelConfig keywords as GPTNeoXConfig reads them: the rotary section's
    values (probe.interop.hf_rope.read_rotary), else the old top-level `rotary_emb_base` and
    `rotary_pct` (10000 and 0.25 when absent)."""
    rotary = read_rotary(hf, context, theta=hf.number("rotary_emb_base", 10000.0), partial=True)
    section = hf.section("rope_scaling")
    if not section.data:
        section = hf.section("rope_parameters")
    fraction = section.number("partial_rotary_factor", hf.number("rotary_pct", 0.25))
    key = "rope_parameters.partial_rotary_factor" if section.has("partial_rotary_factor") else (
        "rotary_pct")  # fmt: skip
    dims = int(d_head * fraction)
    if fraction > 1 or dims < 2 or dims % 2:
        raise ProbeError(
            f"{hf.label}: {key} = {fraction!r:.20} rotates {dims} of the {d_head} dimensions of "
            "each head; probe's rotary embedding needs an even number of them, at least 2 and at "
            "most the head size."
        )
    return {**rotary, "rope_fraction": fraction}


def _head(names: set[str] | None) -> str | None:
    """The output layer's name in the file (None: it has none, or the names are not known)."""
    return next((n for n in HEADS if names is not None and n in names), None)


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    refuse_unimplemented(hf, "GPT-NeoX", OWN_KEYS)
    act = hf.choice("hidden_act", "gelu", ACTIVATIONS, "GPT-NeoX")
    block = common.read(hf, DEFAULTS, KEYS, grouped=False)
    d_head = block["d_model"] // block["n_head"]
    if hf.has("head_dim") and hf.integer("head_dim") != d_head:
        why = f"GPT-NeoX's heads are hidden_size / num_attention_heads = {d_head} wide."
        hf.refuse("head_dim", hf.raw("head_dim"), f"{why} Another head_dim is not implemented.")
    rotary = _rotary(hf, d_head, block["max_len"])
    tied = hf.flag("tie_word_embeddings", False)
    if not tied and names is not None and _head(names) is None:
        raise ProbeError(f"{hf.label}: tie_word_embeddings is false but the weights hold no "
                         "embed_out.weight; the output layer is missing.")  # fmt: skip
    return ModelConfig(
        **block,
        **rotary,
        arch=Arch.DECODER,
        ffn=act,
        norm=Norm.PRE,
        parallel_residual=hf.flag("use_parallel_residual", True),
        pe=PE.ROPE,
        bias=True,  # the MLP always has biases; without attention_bias dense's are zeros
        qkv_bias=hf.flag("attention_bias", True),
        tie_embeddings=tied,
    )


def _names(cfg: ModelConfig) -> dict[str, str]:
    """Hugging Face name -> probe name, for all but the fused query_key_value and the output."""
    names = {
        "gpt_neox.embed_in.weight": "embed.weight",
        "gpt_neox.final_layer_norm.weight": "ln_final.weight",
        "gpt_neox.final_layer_norm.bias": "ln_final.bias",
    }
    for i in range(cfg.n_layer):
        h, b = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        for hf_name, probe_name in (("input_layernorm", "ln_attn"),
                                    ("post_attention_layernorm", "ln_ffn"),
                                    ("attention.dense", "attn.o"), ("mlp.dense_h_to_4h", "ffn.up"),
                                    ("mlp.dense_4h_to_h", "ffn.down")):  # fmt: skip
            names[f"{h}{hf_name}.weight"] = f"{b}{probe_name}.weight"
            if hf_name != "attention.dense" or cfg.qkv_bias:
                names[f"{h}{hf_name}.bias"] = f"{b}{probe_name}.bias"
    return names


def _fused(state: Mapping, name: str, cfg: ModelConfig, rest: tuple[int, ...], where: str):
    """The fused query_key_value tensor `name`: [3 * n_head * d_head, *rest], else one line."""
    tensor = state[name]
    shape = (3 * cfg.n_head * cfg.d_head, *rest)
    if tuple(tensor.shape) != shape:
        raise ProbeError(
            f"{where}: '{name}' has shape {tuple(tensor.shape)} but config.json implies "
            f"{shape}; weights and config do not belong together."
        )
    return tensor


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    fused = [f"gpt_neox.layers.{i}.attention.query_key_value.{p}" for i in range(cfg.n_layer)
             for p in (("weight", "bias") if cfg.qkv_bias else ("weight",))]  # fmt: skip
    require(state, fused, where)
    head = _head(set(state))
    if cfg.tie_embeddings and head is not None:
        same_tied_head(state, "gpt_neox.embed_in.weight", head, where)
    yield from renamed(state, _names(cfg), where)
    for i in range(cfg.n_layer):
        h, b = f"gpt_neox.layers.{i}.attention.", f"blocks.{i}."
        weight = _fused(state, f"{h}query_key_value.weight", cfg, (cfg.d_model,), where)
        rows = weight.view(cfg.n_head, 3, cfg.d_head, -1)  # [head, q|k|v, d_head, d_model]
        for j, x in enumerate("qkv"):
            yield f"{b}attn.{x}.weight", rows[:, j].reshape(-1, weight.shape[-1])
        if cfg.qkv_bias:
            bias = _fused(state, f"{h}query_key_value.bias", cfg, (), where)
            parts = bias.view(cfg.n_head, 3, cfg.d_head)
            for j, x in enumerate("qkv"):
                yield f"{b}attn.{x}.bias", parts[:, j].reshape(-1)
        else:  # attention_bias false: no bias on dense either; probe's o has one of zeros
            yield f"{b}attn.o.bias", torch.zeros(cfg.d_model, dtype=weight.dtype)
        del weight
    if not cfg.tie_embeddings:
        yield "head.weight", state[head or HEADS[0]]


def padded(tensor, kept: tuple[int, ...], total: int, d_head: int, dim: int):
    """`tensor` holding the `d_head`-wide slices of heads (or key/value groups) `kept` along
    `dim`, written out with all `total` in place, a removed one's slice zero: how a format with
    one head count for the unpruned model holds a pruned one (the same function)."""
    if len(kept) == total:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = total * d_head
    rows = [h * d_head + j for h in kept for j in range(d_head)]
    index = torch.tensor(rows, dtype=torch.long, device=tensor.device)
    return tensor.new_zeros(shape).index_copy(dim, index, tensor)


def _padded(state: dict, name: str, kept: tuple[int, ...], cfg: ModelConfig, dim: int):
    """Probe's tensor `name` of the heads `kept` with every head of the unpruned model in place
    along `dim`, a removed head's slice zero."""
    return padded(state[name], kept, cfg.n_head, cfg.d_head, dim)


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    """GPT-NeoX's config has no head size: it is hidden_size / num_attention_heads, so a pruned
    model is written with every head, a removed head's q, k, v rows and dense columns zero (its
    output is zero: the same function, at the unpruned size)."""
    weights = {hf: state[p] for hf, p in _names(cfg).items()}
    for site in cfg.sites():
        h, b, kept = f"gpt_neox.layers.{site.index}.attention.", f"{site.name}.", site.kept_heads
        weights[f"{h}dense.weight"] = _padded(state, f"{b}o.weight", kept, cfg, 1)
        weights[f"{h}dense.bias"] = state[f"{b}o.bias"]
        parts = [_padded(state, f"{b}{x}.weight", kept, cfg, 0) for x in "qkv"]
        qkv = [w.view(cfg.n_head, 1, cfg.d_head, -1) for w in parts]  # [head, 1, d_head, d_model]
        weights[f"{h}query_key_value.weight"] = torch.cat(qkv, 1).reshape(-1, cfg.d_model)
        if cfg.qkv_bias:
            parts = [_padded(state, f"{b}{x}.bias", kept, cfg, 0) for x in "qkv"]
            qkv = [p.view(cfg.n_head, 1, cfg.d_head) for p in parts]
            weights[f"{h}query_key_value.bias"] = torch.cat(qkv, 1).reshape(-1)
        else:  # written with attention_bias true: zero q/k/v biases compute the same
            weights[f"{h}query_key_value.bias"] = torch.zeros(3 * cfg.n_head * cfg.d_head)
    if not cfg.tie_embeddings:
        weights["embed_out.weight"] = state["head.weight"]
    hf = common.write(cfg, "gpt_neox", "GPTNeoXForCausalLM", EXPORTED[cfg.ffn], keys=KEYS)
    return {
        **hf,
        "use_parallel_residual": cfg.parallel_residual,
        "attention_bias": True,
        "rope_parameters": rotary_to_hf(cfg, fraction=True),
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
    }, weights
