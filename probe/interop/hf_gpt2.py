"""GPT-2 family: pre-LN, learned positions, GELU with the tanh approximation (`gelu_new`),
Conv1D weights stored [in, out] (transposed here), fused c_attn, tied output embedding."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import PE, Arch, ModelConfig, Norm
from probe.interop import common
from probe.interop.family_parts import (
    ACTIVATIONS,
    EXPORTED,
    refuse_unimplemented,
    renamed,
    require,
    require_unpruned,
    tied_output,
)
from probe.interop.fields import Fields

MODEL_TYPES = ("gpt2",)
# GPT2Config's names of the shared keys (its attribute_map; a LayerNorm's epsilon)
KEYS = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
        "intermediate_size": "n_inner", "max_position_embeddings": "n_positions",
        "rms_norm_eps": "layer_norm_epsilon", "hidden_act": "activation_function"}  # fmt: skip
# source tensors probe leaves unused: the causal-mask buffers of older files, a tied lm_head
IGNORED = (r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias", r"lm_head\.weight")


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    refuse_unimplemented(hf, "GPT-2")
    act = hf.choice(KEYS["hidden_act"], "gelu_new", ACTIVATIONS, "GPT-2")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.flag(flag, False):
            hf.refuse(flag, True, "this attention variant is not implemented in probe's GPT-2.")
    if not hf.flag("scale_attn_weights", True):
        hf.refuse("scale_attn_weights", False, "unscaled attention is not implemented in probe's "
                  "GPT-2.")  # fmt: skip
    inner = 4 * hf.integer("n_embd")  # GPT2Config's n_inner when absent
    block = common.read(hf, {"intermediate_size": inner, "rms_norm_eps": 1e-5}, KEYS, grouped=False)
    return ModelConfig(
        **block,
        arch=Arch.DECODER,
        ffn=act,
        norm=Norm.PRE,
        pe=PE.LEARNED,
        tie_embeddings=tied_output(hf, names, default=True),
    )


def _prefix(state: Mapping) -> str:
    return "transformer." if any(k.startswith("transformer.") for k in state) else ""


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    p = _prefix(state)
    names = {
        f"{p}wte.weight": "embed.weight",
        f"{p}wpe.weight": "positions.table.weight",
        f"{p}ln_f.weight": "ln_final.weight",
        f"{p}ln_f.bias": "ln_final.bias",
    }
    conv = {"attn.c_proj": "attn.o", "mlp.c_fc": "ffn.up", "mlp.c_proj": "ffn.down"}
    blocks = {}  # probe prefix -> Hugging Face prefix
    for i in range(cfg.n_layer):
        h, b = f"{p}h.{i}.", f"blocks.{i}."
        names |= {
            f"{h}ln_1.weight": f"{b}ln_attn.weight",
            f"{h}ln_1.bias": f"{b}ln_attn.bias",
            f"{h}ln_2.weight": f"{b}ln_ffn.weight",
            f"{h}ln_2.bias": f"{b}ln_ffn.bias",
            f"{h}attn.c_proj.bias": f"{b}attn.o.bias",
            f"{h}mlp.c_fc.bias": f"{b}ffn.up.bias",
            f"{h}mlp.c_proj.bias": f"{b}ffn.down.bias",
        }
        blocks[b] = h
    inside = ("attn.c_attn.weight", "attn.c_attn.bias", *(f"{c}.weight" for c in conv))
    fused = [f"{h}{name}" for h in blocks.values() for name in inside]
    require(state, fused, where)
    yield from renamed(state, names, where)
    for b, h in blocks.items():
        weight, bias = state[f"{h}attn.c_attn.weight"], state[f"{h}attn.c_attn.bias"]
        for name, w, part in zip("qkv", weight.chunk(3, dim=1), bias.chunk(3), strict=True):
            yield f"{b}attn.{name}.weight", w.t()  # Conv1D [in, out] -> [out, in]
            yield f"{b}attn.{name}.bias", part
        del weight, bias
        for hf_name, probe_name in conv.items():
            yield f"{b}{probe_name}.weight", state[f"{h}{hf_name}.weight"].t()
    if not cfg.tie_embeddings:
        yield "head.weight", state["lm_head.weight"]


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    require_unpruned(cfg, "GPT-2", " (n_embd / n_head)")
    w = {
        "transformer.wte.weight": state["embed.weight"],
        "transformer.wpe.weight": state["positions.table.weight"],
        "transformer.ln_f.weight": state["ln_final.weight"],
        "transformer.ln_f.bias": state["ln_final.bias"],
    }
    for i in range(cfg.n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        for ln, probe_ln in (("ln_1", "ln_attn"), ("ln_2", "ln_ffn")):
            w[f"{h}{ln}.weight"] = state[f"{b}{probe_ln}.weight"]
            w[f"{h}{ln}.bias"] = state[f"{b}{probe_ln}.bias"]
        qkv = [state[f"{b}attn.{n}.weight"] for n in "qkv"]
        w[f"{h}attn.c_attn.weight"] = torch.cat(qkv, dim=0).t().contiguous()
        w[f"{h}attn.c_attn.bias"] = torch.cat([state[f"{b}attn.{n}.bias"] for n in "qkv"])
        for hf_name, probe_name in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "ffn.up"),
                                    ("mlp.c_proj", "ffn.down")):  # fmt: skip
            w[f"{h}{hf_name}.weight"] = state[f"{b}{probe_name}.weight"].t().contiguous()
            w[f"{h}{hf_name}.bias"] = state[f"{b}{probe_name}.bias"]
    if not cfg.tie_embeddings:
        w["lm_head.weight"] = state["head.weight"]
    hf = common.write(cfg, "gpt2", "GPT2LMHeadModel", EXPORTED[cfg.ffn], keys=KEYS)
    return {
        **hf,
        "tie_word_embeddings": cfg.tie_embeddings,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }, w
