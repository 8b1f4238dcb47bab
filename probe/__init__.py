"""probe: train Transformers and measure what happens inside them."""

from probe.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from probe.config import ModelConfig, TrainConfig
from probe.errors import ProbeError
from probe.model import Transformer

__all__ = [
    "Checkpoint",
    "ModelConfig",
    "ProbeError",
    "TrainConfig",
    "Transformer",
    "load_checkpoint",
    "save_checkpoint",
]
