"""Checkpoints: a directory with config.json and the weights, model.safetensors or (a model
larger than `probe.weights.SHARD_BYTES`) shards and their index (+ metrics.csv, tokenizer.json).

Writing goes through temporary names and `os.replace`, so a crash never leaves a torn file and
never destroys the previous good checkpoint. Loading checks every tensor's shape against the
config and refuses pickle files unless the caller explicitly allows them.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from probe.checkpoint_files import CONFIG, FORMAT, FORMAT_VERSION, TOKENIZER, read_config
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.files import atomic_write_text, check_input_file
from probe.interop.tokenizer import load_tokenizer, save_tokenizer
from probe.measure.memory import check_model
from probe.model import Transformer
from probe.runtime import Runtime, dtype_name, resolve_dtype
from probe.train_config import TrainConfig
from probe.weights import (
    WEIGHTS,
    nonfinite,
    open_weights,
    weights_dtype,
    write_weights,
)

if TYPE_CHECKING:
    from probe.runtime import Runtime

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")


@dataclass
class Checkpoint:
    model: Transformer
    model_cfg: ModelConfig
    task: TaskConfig | None  # the task it was trained on (None: an imported model)
    train_cfg: TrainConfig | None  # how it was trained (None: an imported model)
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    # where an imported model came from: format, path, model_type, objective (None: trained here)
    source: dict[str, Any] | None = None

    @property
    def config(self) -> ModelConfig:
        return self.model_cfg

    @property
    def imported(self) -> bool:
        return self.source is not None

    @property
    def objective(self) -> str | None:
        """How an imported model is scored on text (causal-lm, masked-lm, embedding)."""
        return None if self.source is None else self.source.get("objective")

    def tokenizer(self) -> Any:
        """The tokenizer saved with an imported model (a `tokenizers.Tokenizer`)."""
        if self.path is None or not (self.path / TOKENIZER).is_file():
            raise ProbeError(
                f"{self.path}: no {TOKENIZER} in the checkpoint, so text cannot be tokenized; "
                "import the model again from a directory that has one."
            )
        return load_tokenizer(self.path / TOKENIZER)


def _state_for_saving(model: Transformer) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    if model.cfg.tie_embeddings:
        state.pop("head.weight", None)  # the same tensor as embed.weight
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def save_checkpoint(
    path: str | Path,
    model: Transformer,
    task: TaskConfig | None,
    train_cfg: TrainConfig | None,
    meta: dict[str, Any] | None = None,
    *,
    source: dict[str, Any] | None = None,
    tokenizer: Any | None = None,
    shard_bytes: int | None = None,
) -> Path:
    """Write the checkpoint directory `path` (created if needed); returns it.

    A model trained here has its task and training config; an imported one has `source`
    instead (and its tokenizer, written as tokenizer.json). The weights are written in their
    dtype from the model itself, in shards of at most `shard_bytes` (default
    `probe.weights.SHARD_BYTES`) when larger."""
    if source is None and (task is None or train_cfg is None):
        raise ValueError("a checkpoint needs its task and training config, or an import source")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dtype": dtype_name(weights_dtype(model)),
        "model": model.cfg.to_dict(),
        "task": None if task is None else task.to_dict(),
        "train": None if train_cfg is None else train_cfg.to_dict(),
        "meta": meta or {},
    }
    if source is not None:
        document["source"] = source
    if tokenizer is not None:
        save_tokenizer(tokenizer, path / TOKENIZER)
    write_weights(path, _state_for_saving(model), shard_bytes)
    atomic_write_text(path / CONFIG, json.dumps(document, indent=2, default=str) + "\n")
    return path


class _Weights:
    """The tensors of a checkpoint, read one at a time: names and shapes come from the
    safetensors headers (one file or shards), each tensor is read when asked for (so loading
    never holds a second copy of the model). Pickle weights, when allowed, are a dict read
    whole."""

    def __init__(self, path: Path, allow_pickle: bool) -> None:
        check_input_file(path / WEIGHTS, "the safetensors weights file")
        self._file = open_weights(path, "re-train or restore it.")
        if self._file is not None:
            self.shapes = dict(self._file.shapes)
            self._state = None
            return
        self._state = _load_pickle(path, allow_pickle)
        self.shapes = {n: tuple(t.shape) for n, t in self._state.items()}

    def pop(self, name: str) -> None:
        self.shapes.pop(name, None)

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._file is not None:
            return self._file[name]
        return self._state[name]


def _load_pickle(path: Path, allow_pickle: bool) -> dict[str, torch.Tensor]:
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if not pickles:
        raise ProbeError(f"'{path}' is not a complete checkpoint: {WEIGHTS} is missing.")
    if not allow_pickle:
        raise ProbeError(
            f"'{path}' holds pickle weights ({pickles[0].name}) and no {WEIGHTS}. Pickle can run "
            "code when loaded; pass --allow-pickle only if you trust its source."
        )
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's news
            warnings.simplefilter("ignore")
            state = torch.load(pickles[0], map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ProbeError(_unsafe_pickle(pickles[0], exc)) from exc
    if not isinstance(state, dict):
        raise ProbeError(f"{pickles[0]} does not hold a state dict.")
    return state


def _unsafe_pickle(path: Path, exc: Exception) -> str:
    """One line for a pickle that torch's weights-only loader refused (never torch's own advice
    to load it unsafely)."""
    found = re.search(r"unsupported GLOBAL (\S+)", str(exc))
    if found:
        return (f"{path} asks to run {found.group(1)} when loaded, which weights never need; "
                "probe refuses to run it. Do not load this file.")  # fmt: skip
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{path} cannot be loaded as plain weights ({first[:120]})."


def stored_dtype(document: dict[str, Any]) -> torch.dtype:
    """The dtype a checkpoint's weights were saved in (float32 for checkpoints that predate the
    record)."""
    name = document.get("dtype", "float32")
    try:
        return resolve_dtype(name)
    except ProbeError:
        raise ProbeError(
            f"config.json records dtype {name!r:.40}, which probe does not hold weights in (the "
            "file was edited or damaged)."
        ) from None


def load_checkpoint(
    path: str | Path,
    device: str | torch.device | None = None,
    allow_pickle: bool = False,
    dtype: str | torch.dtype | None = None,
    runtime: Runtime | None = None,
    read_weights: bool = True,
) -> Checkpoint:
    """Load a checkpoint directory onto `device` (default: the CPU) in `dtype` (default: the
    dtype it was saved in); a `runtime` gives both. Every tensor's name and shape is checked
    against the config before any is read, then each is read, checked and copied into the model
    one at a time: memory is one copy of the weights in the dtype asked for.

    `read_weights=False` checks the files, names and shapes but reads no tensor: the model is
    on the meta device (for what its structure tells: `probe info` of an 8B model)."""
    if runtime is None:
        runtime = Runtime(torch.device("cpu" if device is None else device), resolve_dtype(dtype))
    elif device is not None or dtype is not None:
        raise ValueError("give either a runtime or device/dtype, not both")
    document = read_config(path)
    path = Path(path)
    if path.is_file():
        path = path.parent
    version = document.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
        raise ProbeError(
            f"{path / CONFIG} has format_version {version!r}; this probe reads versions up to "
            f"{FORMAT_VERSION}. Upgrade probe to read it."
        )
    try:
        model_cfg = ModelConfig.from_dict(document["model"])
        task = train_cfg = None
        if isinstance(document.get("task"), dict):
            task = TaskConfig.from_dict(document["task"])
        if isinstance(document.get("train"), dict):
            train_cfg = TrainConfig.from_dict(document["train"])
    except (ProbeError, TypeError) as exc:
        raise ProbeError(f"{path / CONFIG} does not describe a valid model: {exc}") from exc
    try:
        target = runtime.weights_dtype(stored_dtype(document))
    except ProbeError as exc:
        raise ProbeError(f"{path / CONFIG}: {exc}") from None
    check_model(model_cfg, dtype=target)
    weights = _Weights(path, allow_pickle)
    model = Transformer.empty(model_cfg, target, runtime.device if read_weights else "meta")
    expected = model.state_dict()
    if model_cfg.tie_embeddings:
        expected.pop("head.weight", None)
        weights.pop("head.weight")
    missing = sorted(set(expected) - set(weights.shapes))
    unexpected = sorted(set(weights.shapes) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
        if unexpected:
            extra = ", ".join(unexpected[:3]) + (" ..." if len(unexpected) > 3 else "")
            parts.append(f"unexpected {extra}")
        raise ProbeError(f"{path}: the weights do not match config.json ({'; '.join(parts)}).")
    if task is not None and task.vocab_size > model_cfg.vocab_size:
        raise ProbeError(
            f"{path / CONFIG}: task '{task.name}' needs {task.vocab_size} tokens but the model has "
            f"a vocabulary of {model_cfg.vocab_size}."
        )
    for name, shape in weights.shapes.items():
        if shape != tuple(expected[name].shape):
            raise ProbeError(
                f"{path}: tensor '{name}' has shape {shape} but config.json implies "
                f"{tuple(expected[name].shape)}; weights and config do not belong together."
            )
    with torch.no_grad():
        for name in weights.shapes if read_weights else ():
            tensor = weights[name]
            if not tensor.is_floating_point():
                raise ProbeError(
                    f"{path}: tensor '{name}' holds {tensor.dtype} values; weights must be "
                    "floating point (the file was not written by probe, or was damaged)."
                )
            if nonfinite(tensor):
                raise ProbeError(
                    f"{path}: tensor '{name}' holds NaN or infinite values, so every measurement "
                    "would be meaningless (a diverged run?); retrain from an earlier checkpoint."
                )
            expected[name].copy_(tensor)
            del tensor
    model.eval()
    source = document.get("source") if isinstance(document.get("source"), dict) else None
    return Checkpoint(model, model_cfg, task, train_cfg, document.get("meta", {}), path, source)
