"""Model families probe can import: a registry from Hugging Face `model_type` to the module that
knows that family's config keys and weight names (one module per family, one entry here).

Each family module offers
    config(hf, where, names) -> ModelConfig   the probe config that computes the same function
    to_probe(hf_state, cfg, where) -> dict     Hugging Face weights under probe's names
    to_hf(state, cfg) -> (dict, dict)          probe weights back to a config.json + weights
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from probe.config import did_you_mean
from probe.errors import ProbeError


def _modules() -> dict[str, ModuleType]:
    from probe.interop import hf_bert, hf_gpt2, hf_llama

    return {t: m for m in (hf_bert, hf_gpt2, hf_llama) for t in m.MODEL_TYPES}


def supported() -> list[str]:
    """The Hugging Face model types probe imports."""
    return sorted(_modules())


def family(hf_config: dict[str, Any], where: str) -> ModuleType:
    """The family module of a Hugging Face config.json, or one clear line naming what is
    supported."""
    model_type = hf_config.get("model_type")
    modules = _modules()
    if model_type not in modules:
        known = ", ".join(supported())
        hint = did_you_mean(str(model_type), list(modules)) if model_type else ""
        raise ProbeError(
            f"{where}: model_type {model_type!r} is not supported.{hint} probe imports these "
            f"architectures: {known}."
        )
    return modules[model_type]


def rename(state: dict, names: dict[str, str], where: str) -> dict:
    """`state` with every key in `names` renamed; a missing one is a clear error."""
    missing = sorted(set(names) - set(state))
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ProbeError(f"{where}: the weights lack {shown}; the checkpoint is incomplete.")
    return {new: state[old] for old, new in names.items()}


def tied_output(hf: dict[str, Any], names: set[str] | None, default: bool) -> bool:
    """Whether the output layer shares the token embedding: the config says so (absent: the
    family's `default`) when the file has an lm_head; without one it must."""
    if names is not None and "lm_head.weight" in names:
        return bool(hf.get("tie_word_embeddings", default))
    return True


def require_unpruned(cfg, name: str, detail: str = "") -> None:
    """One clear line when a pruned model meets a format with one head count and head size for
    every layer (BERT, GPT-2)."""
    if any(len(s.kept_heads) != cfg.n_head for s in cfg.sites()):
        raise ProbeError(
            f"A pruned {name} model cannot be written as a Hugging Face {name}: its config has "
            f"one head count and head size for every layer{detail}. Export the unpruned model, "
            "or keep it as a probe checkpoint."
        )


def number(hf: dict[str, Any], key: str, where: str, default: Any = None) -> Any:
    """hf[key] (or `default`), with a clear error when it is absent and has no default."""
    value = hf.get(key, default)
    if value is None:
        raise ProbeError(f"{where}: config.json has no '{key}'.")
    return value
