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


def number(hf: dict[str, Any], key: str, where: str, default: Any = None) -> Any:
    """hf[key] (or `default`), with a clear error when it is absent and has no default."""
    value = hf.get(key, default)
    if value is None:
        raise ProbeError(f"{where}: config.json has no '{key}'.")
    return value
