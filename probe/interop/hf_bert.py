"""BERT family (BERT, MiniLM and similar encoders): post-LN, learned absolute positions, token
types, a LayerNorm on the embeddings, GELU, biases everywhere; the masked-LM head when present."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.config import PE, Arch, ModelConfig, Norm
from probe.errors import ProbeError
from probe.interop.families import (
    ACTIVATIONS,
    EXPORTED,
    refuse_unimplemented,
    renamed,
    require_unpruned,
)
from probe.interop.fields import Fields

MODEL_TYPES = ("bert",)
MLM = "cls.predictions."
# source tensors probe leaves unused: buffers, the pooler and next-sentence head (neither feeds
# the hidden states or the MLM logits), the MLM decoder tied to the token embedding
IGNORED = (r"(bert\.)?embeddings\.position_ids", r"(bert\.)?pooler\..*",
           r"cls\.seq_relationship\..*", r"cls\.predictions\.decoder\..*")  # fmt: skip


def config(hf: Fields | dict, where: str, names: set[str] | None = None) -> ModelConfig:
    hf = Fields.of(hf, where)
    refuse_unimplemented(hf, "BERT")
    act = hf.choice("hidden_act", "gelu", ACTIVATIONS, "BERT")
    hf.choice("position_embedding_type", "absolute", ("absolute",), "BERT")
    d_model = hf.integer("hidden_size")
    n_head = hf.integer("num_attention_heads")
    hf.divides("hidden_size", "num_attention_heads")
    has_head = names is not None and any(n.startswith(MLM) for n in names)
    if has_head and not hf.flag("tie_word_embeddings", True) and f"{MLM}decoder.weight" in names:
        hf.refuse("tie_word_embeddings", False, "an MLM decoder apart from the token "
                  "embedding is not implemented in probe's BERT.")  # fmt: skip
    return ModelConfig(
        arch=Arch.ENCODER,
        vocab_size=hf.integer("vocab_size"),
        n_layer=hf.integer("num_hidden_layers"),
        n_head=n_head,
        d_model=d_model,
        ffn=act,
        ffn_mult=hf.integer("intermediate_size") / d_model,
        norm=Norm.POST,
        pe=PE.LEARNED,
        max_len=hf.integer("max_position_embeddings"),
        ln_eps=hf.number("layer_norm_eps", 1e-12),
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
    act = EXPORTED[cfg.ffn]
    hf = {
        "model_type": "bert",
        "architectures": ["BertForMaskedLM" if cfg.head_transform else "BertModel"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "intermediate_size": cfg.d_ff,
        "hidden_act": act,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.ln_eps,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    return hf, weights
