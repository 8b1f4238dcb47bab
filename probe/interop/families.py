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

A family module reads and writes the settings every family shares through
`probe.interop.common`, takes the checks and tables families share from
`probe.interop.family_parts` (below the family modules, as this registry stands above them),
and states only what its model does otherwise; a Llama-derived family
(OLMo-2, Phi-3, Gemma, SmolLM3, and OLMo-3 from OLMo-2) states its differences from
`hf_llama`'s block, as transformers' `modular_*.py` files do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from probe.errors import ProbeError


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
