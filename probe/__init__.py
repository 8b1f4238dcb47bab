"""probe: train Transformers and measure what happens inside them.

The names below are imported on first use (PEP 562), so `import probe.errors` or `probe.config`
(what the command line needs to print its help) does not import torch."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Checkpoint": "probe.checkpoint",
    "load_checkpoint": "probe.checkpoint",
    "save_checkpoint": "probe.checkpoint",
    "ModelConfig": "probe.config",
    "TrainConfig": "probe.config",
    "ProbeError": "probe.errors",
    "Transformer": "probe.model",
}

__all__ = [
    "Checkpoint",
    "ModelConfig",
    "ProbeError",
    "TrainConfig",
    "Transformer",
    "load_checkpoint",
    "save_checkpoint",
]

if TYPE_CHECKING:
    from probe.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from probe.config import ModelConfig
    from probe.errors import ProbeError
    from probe.model import Transformer
    from probe.train_config import TrainConfig


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
