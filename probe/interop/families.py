"""Model families probe can import: a registry from Hugging Face `model_type` to the module that
knows that family's config keys and weight names (one module per family, one entry here).

Each family module offers
    MODEL_TYPES, IGNORED                      its model types; source tensors it may leave unused
    config(hf, where, names) -> ModelConfig   the probe config that computes the same function
                                              (`hf` a `Fields` over config.json: typed reads)
    to_probe(hf_state, cfg, where)            Hugging Face weights under probe's names: yields
        -> Iterator[(probe name, tensor)]     them one at a time, reading `hf_state` (a lazy
                                              mapping) only as it goes; run once on meta tensors
                                              to check names and shapes before any is read
    to_hf(state, cfg) -> (dict, dict)          probe weights back to a config.json + weights
and may set
    PRUNED_EXPORT                              why a pruned model is written at its unpruned
                                              size with the removed heads zero (said by
                                              `probe export`), where the format cannot hold it
                                              (`hf_neox.padded` writes them)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

from probe.config import FFN
from probe.errors import ProbeError
from probe.interop.fields import Fields


def _modules() -> dict[str, ModuleType]:
    from probe.interop import (
        hf_bert,
        hf_gemma,
        hf_gpt2,
        hf_llama,
        hf_neox,
        hf_olmo2,
        hf_olmo3,
        hf_phi3,
        hf_smollm3,
    )

    families = (hf_bert, hf_gpt2, hf_llama, hf_gemma, hf_neox, hf_olmo2, hf_phi3, hf_smollm3,
                hf_olmo3)  # fmt: skip
    return {t: m for m in families for t in m.MODEL_TYPES}


# Hugging Face model types probe does not import, -> the feature its model cannot express yet:
# named in the refusal, so a user knows what is missing rather than only that it is
MISSING = {
    "mixtral": "mixture-of-experts FFN layers",
    "qwen2_moe": "mixture-of-experts FFN layers",
    "qwen3_moe": "mixture-of-experts FFN layers",
    "olmoe": "mixture-of-experts FFN layers",
    "deepseek_v2": "multi-head latent attention and mixture-of-experts layers",
    "deepseek_v3": "multi-head latent attention and mixture-of-experts layers",
    "falcon": "Falcon's multi-query fused attention layout and parallel blocks",
    "gpt_bigcode": "multi-query attention in GPT-2's fused layout",
    "gptj": "GPT-J's interleaved (rotate-every-two) rotary layout",
    "bloom": "ALiBi in BLOOM's fused layout",
    "mpt": "MPT's ALiBi and clipped fused qkv",
    "opt": "OPT's offset learned positions",
    "phi": "Phi-1/2's partial rotary with parallel blocks and dense-layer naming",
    "t5": "an encoder-decoder with relative position buckets",
    "mamba": "state-space layers (no attention)",
    "mamba2": "state-space layers (no attention)",
    "recurrent_gemma": "recurrent (Griffin) layers",
    "cohere": "parallel blocks with LayerNorm without bias and logit scaling",
    "starcoder2": "StarCoder2's biases and sliding window in a GPT-style block",
    # real model types whose names look like supported ones
    "olmo": "OLMo-1's LayerNorm without weights and clipped q/k/v",
    "gemma3n": "Gemma 3n's per-layer embeddings, AltUp and LAuReL blocks",
    "llama4": "mixture-of-experts FFN layers and chunked attention",
    "qwen3_next": "gated DeltaNet (linear attention) layers and mixture-of-experts FFN layers",
}


def _slip(a: str, b: str) -> bool:
    """Whether the word `a` is `b` typed with one slip: two adjacent letters swapped, a letter
    doubled or undoubled, one dropped or added inside the word (at an end it makes another
    word: 'gemma' + 'n'), or one replaced in a word of 6 letters or more ('llava' is not
    'llama')."""
    a, b = sorted((a, b), key=len)
    if len(a) == len(b):
        slips = [i for i in range(len(a)) if a[i] != b[i]]
        if len(slips) == 1:
            return len(a) >= 6
        i = slips[0] if len(slips) == 2 and slips[1] == slips[0] + 1 else None
        return i is not None and (a[i], a[i + 1]) == (b[i + 1], b[i])
    if len(b) != len(a) + 1:
        return False
    at = next((i for i in range(len(a)) if a[i] != b[i]), len(a))  # b's extra letter
    if b[:at] + b[at + 1 :] != a:
        return False
    doubled = (at > 0 and b[at - 1] == b[at]) or (at + 1 < len(b) and b[at + 1] == b[at])
    return doubled or 0 < at < len(a)


def _typo(name: str, known: str) -> bool:
    """Whether `name` is the model type `known` mistyped: the same once case, '-', '_' and '.'
    are dropped ('gpt-neox', 'Qwen_2'), or the same words and numbers but one word with one
    slip (`_slip`: 'lama', 'mistal'). A different number ('olmo4', 'qwen4') or a word more
    ('gemma3n', 'qwen2_vl') names another model, never a typo."""
    if re.sub(r"[\W_]", "", name.lower()) == re.sub(r"[\W_]", "", known.lower()):
        return True
    words, target = (re.findall(r"[a-z]+|\d+", n.lower()) for n in (name, known))
    if len(words) != len(target):
        return False
    differ = [(a, b) for a, b in zip(words, target, strict=True) if a != b]
    return len(differ) == 1 and differ[0][0].isalpha() and _slip(*differ[0])


def _suggestion(name: str, known: Iterable[str]) -> str:
    """' Did you mean 'x'?' when `name` is a supported model type mistyped (`_typo`), else ''."""
    close = [k for k in sorted(known) if _typo(name, k)]
    return f" Did you mean '{close[0]}'?" if len(close) == 1 else ""


# Hugging Face activation names -> probe's FFN, one table for every family that reads one:
# gelu_new, gelu_fast and gelu_pytorch_tanh are all GELU's tanh form (probe computes torch's)
ACTIVATIONS = {"gelu": FFN.GELU, "gelu_new": FFN.GELU_TANH, "gelu_fast": FFN.GELU_TANH,
               "gelu_pytorch_tanh": FFN.GELU_TANH, "relu": FFN.RELU}  # fmt: skip
EXPORTED = {FFN.GELU: "gelu", FFN.GELU_TANH: "gelu_new", FFN.RELU: "relu"}  # the name written


def supported() -> list[str]:
    """The Hugging Face model types probe imports."""
    return sorted(_modules())


def family(hf_config: dict[str, Any], where: str) -> ModuleType:
    """The family module of a Hugging Face config.json, or one clear line naming what is
    supported."""
    model_type = hf_config.get("model_type")
    modules = _modules()
    known = ", ".join(supported())
    if model_type is None:
        raise ProbeError(
            f"{where}: config.json has no model_type, so the architecture is unknown; add the "
            f"Hugging Face model type (probe imports {known})."
        )
    if isinstance(model_type, str) and model_type in MISSING and model_type not in modules:
        raise ProbeError(
            f"{where}: model_type {model_type!r} is not supported: it needs "
            f"{MISSING[model_type]}, which probe's model cannot express yet. probe imports "
            f"these architectures: {known}."
        )
    if not isinstance(model_type, str) or model_type not in modules:
        hint = _suggestion(model_type, modules) if isinstance(model_type, str) else ""
        raise ProbeError(
            f"{where}: model_type {model_type!r:.60} is not supported.{hint} probe imports these "
            f"architectures: {known}."
        )
    return modules[model_type]


def require(state: Mapping, names: Iterable[str], where: str) -> None:
    """Every one of `names` is in `state`; a missing one is a clear error."""
    missing = sorted(set(names) - set(state))
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ProbeError(f"{where}: the weights lack {shown}; the checkpoint is incomplete.")


def rename(state: Mapping, names: dict[str, str], where: str) -> dict:
    """`state` with every key in `names` renamed; a missing one is a clear error."""
    require(state, names, where)
    return {new: state[old] for old, new in names.items()}


def renamed(state: Mapping, names: dict[str, str], where: str) -> Iterator[tuple[str, Any]]:
    """(new name, tensor) for every key in `names`, each read from `state` when it is reached;
    a missing one is a clear error before any is read."""
    require(state, names, where)
    for old, new in names.items():
        yield new, state[old]


def tied_output(hf: Fields, names: set[str] | None, default: bool) -> bool:
    """Whether the output layer shares the token embedding: the config says so (absent: the
    family's `default`) when the file has an lm_head; without one it must."""
    tied = hf.flag("tie_word_embeddings", default)
    if names is None or "lm_head.weight" in names:
        return tied if names is not None else True
    if hf.has("tie_word_embeddings") and not tied:  # transformers would start a random head
        hf.refuse(
            "tie_word_embeddings",
            False,
            "the weights hold no lm_head.weight, so the "
            "output layer is missing (the file is incomplete, or the flag is wrong).",
        )
    return True


def same_tied_head(state: Mapping, embed: str, head: str, where: str) -> None:
    """A tied model whose file also holds an output layer (`head`): transformers 5 ties the two
    only when they are equal, else it computes with each as stored, which probe's tied model
    cannot; one clear line then. No-op on a header pass (meta tensors) or without `head`."""
    if head not in state or state[embed].is_meta:
        return
    table, output = state[embed], state[head]  # [vocab, d_model] each
    if output.shape != table.shape or not bool((output == table.to(output.dtype)).all()):
        raise ProbeError(
            f"{where}: tie_word_embeddings is true but {head} differs from {embed}; "
            "transformers then computes with each as stored (untied). Set tie_word_embeddings "
            "to false in config.json to import the model as transformers runs it."
        )


# Config keys of other families that change the function computed, -> (the values that compute
# what probe computes, the feature). A config of a supported family that sets one is refused.
UNIMPLEMENTED = {
    "attn_logit_softcapping": ((None,), "soft-capped attention logits"),
    "final_logit_softcapping": ((None,), "soft-capped output logits"),
    "partial_rotary_factor": ((None, 1, 1.0), "rotary embedding on part of each head"),
    "query_pre_attn_scalar": ((None,), "a query scale other than 1/sqrt(head_dim)"),
    "attention_multiplier": ((None,), "a query scale other than 1/sqrt(head_dim)"),
    "logits_scaling": ((None, 1, 1.0), "scaled output logits"),
    "embedding_multiplier": ((None, 1, 1.0), "scaled token embeddings"),
    "residual_multiplier": ((None, 1, 1.0), "scaled residual branches"),
    "qk_layernorm": ((None, False), "norms on queries and keys"),
    "use_qk_norm": ((None, False), "norms on queries and keys"),
    "add_cross_attention": ((None, False), "cross-attention layers"),
    "is_decoder": ((None, False), "an encoder run as a causal decoder"),
}


def refuse_unimplemented(hf: Fields, family_name: str, implemented: tuple[str, ...] = ()) -> None:
    """One line naming the first key of UNIMPLEMENTED the config sets to another value (but
    those the family reads itself, `implemented`)."""
    for key, (neutral, feature) in UNIMPLEMENTED.items():
        if key in implemented:
            continue
        value = hf.raw(key)
        if not any(value is n or (type(value) is type(n) and value == n) for n in neutral):
            hf.refuse(key, value, f"{feature} is not implemented in probe's {family_name}.")


LLAMA_NORMS = {"input_layernorm": "ln_attn", "post_attention_layernorm": "ln_ffn"}


def llama_names(
    cfg,
    norms: dict[str, str] = LLAMA_NORMS,
    *,
    body: str = "model.",
    head: str = "lm_head.weight",
    fused: tuple[str, ...] = (),
) -> dict[str, str]:
    """Hugging Face name -> probe name in the layout the Llama-derived families share
    (`{body}layers.i.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, the layer norms
    `norms` (Hugging Face name -> probe name), q_norm/k_norm with QK-norm, q/k/v biases with
    `qkv_bias`, an untied `head`). `fused`: the projections the family stores fused and splits
    itself (Phi-3: q, k, v, gate, up)."""
    names = {f"{body}embed_tokens.weight": "embed.weight", f"{body}norm.weight": "ln_final.weight"}
    for i in range(cfg.n_layer):
        h, b = f"{body}layers.{i}.", f"blocks.{i}."
        names |= {f"{h}{hf}.weight": f"{b}{p}.weight" for hf, p in norms.items()}
        for x in (x for x in "qkvo" if x not in fused):
            names[f"{h}self_attn.{x}_proj.weight"] = f"{b}attn.{x}.weight"
            if cfg.qkv_bias and x != "o":
                names[f"{h}self_attn.{x}_proj.bias"] = f"{b}attn.{x}.bias"
        for x in (x for x in ("gate", "up", "down") if x not in fused):
            names[f"{h}mlp.{x}_proj.weight"] = f"{b}ffn.{x}.weight"
        if cfg.qk_norm:
            names |= {f"{h}self_attn.{x}_norm.weight": f"{b}attn.{x}_norm.weight" for x in "qk"}
    if not cfg.tie_embeddings:
        names[head] = "head.weight"
    return names


def uniform_shape(cfg) -> tuple[int, int] | str:
    """(query heads, key/value heads) shared by every layer, or why there is none."""
    shapes = set()
    for site in cfg.sites():
        per_group = {len(site.group_heads(g)) for g in site.kept_groups}
        if not site.kept_heads:
            return f"{site.name} has no heads left"
        if len(per_group) != 1:
            return f"{site.name} keeps different numbers of query heads in its key/value groups"
        shapes.add((len(site.kept_heads), len(site.kept_groups)))
    if len(shapes) != 1:
        found = ", ".join(f"{q} heads/{kv} groups" for q, kv in sorted(shapes))
        return f"the layers keep different numbers of heads ({found})"
    return shapes.pop()


def require_unpruned(cfg, name: str, detail: str = "") -> None:
    """One clear line when a pruned model meets a format with one head count and head size for
    every layer (BERT, GPT-2)."""
    if any(len(s.kept_heads) != cfg.n_head for s in cfg.sites()):
        raise ProbeError(
            f"A pruned {name} model cannot be written as a Hugging Face {name}: its config has "
            f"one head count and head size for every layer{detail}. Export the unpruned model, "
            "or keep it as a probe checkpoint."
        )


LAYER_TYPES = ("full_attention", "sliding_attention")  # the values of `layer_types`


def layer_types(cfg) -> list[str]:
    """The `layer_types` of a probe config: each layer's attention as transformers names it."""
    return [LAYER_TYPES[cfg.window(i) is not None] for i in range(cfg.n_layer)]


def windows(
    hf: Fields, n_layer: int, default_types: list[str], default_window: int | None
) -> tuple[int | None, tuple[int, ...] | None]:
    """(sliding_window, window_layers) of a family whose `layer_types` names each layer's
    attention (absent: `default_types`, as the family's config class fills it in): the layers
    it calls sliding_attention see the last `sliding_window` keys (absent: `default_window`;
    null: none, which transformers cannot run either); none: no window. A `layer_types` that
    is not a list of `n_layer` of LAYER_TYPES, or sliding layers without a window, is one line
    naming the key."""
    types = hf.raw("layer_types", default_types)
    if (
        not isinstance(types, list)
        or len(types) != n_layer
        or any(t not in LAYER_TYPES for t in types)
    ):
        hf.fail("layer_types", f"a list of {n_layer} of {', '.join(LAYER_TYPES)}", types)
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if not layers:
        return None, None
    if hf.get("sliding_window", default_window) is None:  # transformers fails on it too
        hf.fail("sliding_window", "a positive integer (layer_types has sliding layers)", None)
    window = hf.integer("sliding_window", default_window)
    return window, None if len(layers) == n_layer else layers
