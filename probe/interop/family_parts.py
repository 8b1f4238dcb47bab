"""What the family modules share (`probe.interop.hf_*`): one table of activation names, the
checks of weight names and tied heads, the refusal of config keys whose feature probe lacks,
Llama's weight names, the head shapes an export needs, the layer types of sliding-window
models. The registry of families (`probe.interop.families`) stands above the family modules;
this module stands below them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from probe.config import FFN
from probe.errors import ProbeError
from probe.interop.fields import Fields

ACTIVATIONS = {"gelu": FFN.GELU, "gelu_new": FFN.GELU_TANH, "gelu_fast": FFN.GELU_TANH,
               "gelu_pytorch_tanh": FFN.GELU_TANH, "relu": FFN.RELU}  # fmt: skip
EXPORTED = {FFN.GELU: "gelu", FFN.GELU_TANH: "gelu_new", FFN.RELU: "relu"}  # the name written
# the activation names of a gated FFN -> the FFN they make (the first of each: the name written)
GATES = {"silu": FFN.SWIGLU, "gelu_pytorch_tanh": FFN.GEGLU}


def gated(hf: Fields, key: str, ffn: FFN, what: str, aliases: tuple[str, ...] = ()) -> None:
    """The activation `key` names the gate of the family's gated `ffn` (GATES, or one of the
    family's `aliases` for it), else one line naming the names probe implements for `what`."""
    names = (*(name for name, made in GATES.items() if made == ffn), *aliases)
    hf.choice(key, names[0], names, what)


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
    those the family reads itself or ignores, `implemented`)."""
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


def uniform_heads(cfg, name: str) -> tuple[int, int]:
    """(query heads, key/value heads) of every layer, for a format with one head count for
    every layer (the Llama-derived families), or one clear line on how to prune for it."""
    shape = uniform_shape(cfg)
    if isinstance(shape, str):
        raise ProbeError(
            f"This pruned model cannot be written as a Hugging Face {name}: {shape}, but its "
            "config.json has one head count for every layer. Prune with `probe prune --uniform` "
            "(the same number of heads, or groups, in every layer) to make it exportable."
        )
    return shape


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
