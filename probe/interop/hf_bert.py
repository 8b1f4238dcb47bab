"""BERT family (BERT, MiniLM and similar encoders): post-LN, learned absolute positions, token
types, a LayerNorm on the embeddings, GELU, biases everywhere; the masked-LM head when present."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import PE, Arch, ModelConfig, Norm
from probe.errors import ProbeError
from probe.interop import common
from probe.interop.family_parts import (
    ACTIVATIONS,
    EXPORTED,
    refuse_unimplemented,
    renamed,
    require_unpruned,
)
from probe.interop.fields import Fields

MODEL_TYPES = ("bert",)
MLM = "cls.predictions."
# BertConfig's name and default of the shared keys it names or fills in otherwise than Llama's
KEYS = {"rms_norm_eps": "layer_norm_eps"}  # a LayerNorm's epsilon
DEFAULTS = {"rms_norm_eps": 1e-12}
# source tensors probe leaves unused: buffers, the pooler and next-sentence head (neither feeds
# the hidden states or the MLM logits), the MLM decoder tied to the token embedding
IGNORED = (r"(bert\.)?embeddings\.position_ids", r"(bert\.)?pooler\..*",
           r"cls\.seq_relationship\..*", r"cls\.predictions\.decoder\..*")  # fmt: skip


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    refuse_unimplemented(hf, "BERT")
    act = hf.choice("hidden_act", "gelu", ACTIVATIONS, "BERT")
    hf.choice("position_embedding_type", "absolute", ("absolute",), "BERT")
    block = common.read(hf, DEFAULTS, KEYS, grouped=False)
    has_head = names is not None and any(n.startswith(MLM) for n in names)
    if has_head and not hf.flag("tie_word_embeddings", True) and f"{MLM}decoder.weight" in names:
        hf.refuse("tie_word_embeddings", False, "an MLM decoder apart from the token "
                  "embedding is not implemented in probe's BERT.")  # fmt: skip
    return ModelConfig(
        **block,
        arch=Arch.ENCODER,
        ffn=act,
        norm=Norm.POST,
        pe=PE.LEARNED,
        type_vocab_size=hf.integer("type_vocab_size", 2, lo=0),
        embed_norm=True,
        tie_embeddings=True,
        head_transform=has_head,
        head_bias=has_head,
    )


def _names(cfg: ModelConfig, prefix: str) -> dict[str, str]:
    """Hugging Face name -> probe name."""
    e = f"{prefix}embeddings."
    names = {
        e + "word_embeddings.weight": "embed.weight",
        e + "position_embeddings.weight": "positions.table.weight",
        e + "token_type_embeddings.weight": "token_types.weight",
        e + "LayerNorm.weight": "ln_embed.weight",
        e + "LayerNorm.bias": "ln_embed.bias",
    }
    for i in range(cfg.n_layer):
        h, p = f"{prefix}encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            names |= {
                f"{h}attention.self.query.{kind}": f"{p}attn.q.{kind}",
                f"{h}attention.self.key.{kind}": f"{p}attn.k.{kind}",
                f"{h}attention.self.value.{kind}": f"{p}attn.v.{kind}",
                f"{h}attention.output.dense.{kind}": f"{p}attn.o.{kind}",
                f"{h}attention.output.LayerNorm.{kind}": f"{p}ln_attn.{kind}",
                f"{h}intermediate.dense.{kind}": f"{p}ffn.up.{kind}",
                f"{h}output.dense.{kind}": f"{p}ffn.down.{kind}",
                f"{h}output.LayerNorm.{kind}": f"{p}ln_ffn.{kind}",
            }
    if cfg.head_transform:
        for kind in ("weight", "bias"):
            names |= {
                f"{MLM}transform.dense.{kind}": f"head_dense.{kind}",
                f"{MLM}transform.LayerNorm.{kind}": f"ln_head.{kind}",
            }
        names[f"{MLM}bias"] = "head.bias"
    return names


def _prefix(state: Mapping) -> str:
    return "bert." if any(k.startswith("bert.") for k in state) else ""


def to_probe(state: Mapping, cfg: ModelConfig, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in renamed(state, _names(cfg, _prefix(state)), where):
        if name == "token_types.weight" and cfg.type_vocab_size == 0:
            if tensor.numel():  # transformers would refuse the shape: probe must not drop rows
                raise ProbeError(
                    f"{where}: config.json says type_vocab_size 0, but the weights hold token "
                    f"type embeddings of shape {list(tensor.shape)}; the config does not match "
                    "the weights."
                )
            continue
        yield name, tensor


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict, dict]:
    require_unpruned(cfg, "BERT")
    prefix = "bert." if cfg.head_transform else ""
    weights = {hf: state[p] for hf, p in _names(cfg, prefix).items()}
    if cfg.head_transform:
        weights[f"{MLM}decoder.weight"] = state["embed.weight"]
        weights[f"{MLM}decoder.bias"] = state["head.bias"]
    architecture = "BertForMaskedLM" if cfg.head_transform else "BertModel"
    hf = common.write(cfg, "bert", architecture, EXPORTED[cfg.ffn], keys=KEYS)
    return {
        **hf,
        "type_vocab_size": cfg.type_vocab_size,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }, weights
