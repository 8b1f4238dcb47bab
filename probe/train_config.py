"""The training run's configuration: frozen and validated as `probe.config`'s model one."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from probe.errors import ProbeError
from probe.fields import check_device_name, choice, from_dict, to_dict


class Schedule(StrEnum):
    """The learning rate over training."""

    COSINE = "cosine"  # linear warm-up to lr, then cosine decay to lr * lr_min_ratio
    PAPER = "paper"  # lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (the paper: lr = 1)


@dataclass(frozen=True)
class TrainConfig:
    # fields added after the first cached study cells (see ModelConfig.ADDED_LATER)
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("schedule", "adam_eps", "label_smoothing")
    steps: int = 400
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 40  # linear warm-up steps, then cosine decay to lr_min_ratio * lr
    lr_min_ratio: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm (0: no clipping, as in the paper)
    schedule: Schedule = Schedule.COSINE
    adam_eps: float = 1e-8  # the paper: 1e-9
    label_smoothing: float = 0.0  # on the training loss only (the paper: 0.1)
    train_len: tuple[int, int] = (4, 16)  # task lengths drawn uniformly, inclusive
    random_positions: bool = False  # Ruoss et al. 2023: sorted random positions from [0, max_len)
    seed: int = 0
    eval_every: int = 100  # steps between evaluations at the training lengths (0: only at the end)
    eval_batches: int = 2  # batches per length when evaluating
    stats_every: int = 0  # steps between per-head attention statistics (0: never)
    device: str = "auto"  # auto, cpu, cuda, cuda:1, ...
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes kept with the run

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "schedule", choice(Schedule, self.schedule, "schedule", "schedule")
        )
        lo, hi = (int(x) for x in self.train_len)
        object.__setattr__(self, "train_len", (lo, hi))
        if not 1 <= lo <= hi:
            raise ProbeError(f"train_len must be lo:hi with 1 <= lo <= hi, got {lo}:{hi}.")
        for name in ("steps", "batch_size", "eval_batches"):
            if getattr(self, name) < 1:
                raise ProbeError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ProbeError(f"lr must be a positive number, got {self.lr}.")
        if not self.weight_decay >= 0:
            raise ProbeError(f"weight_decay must not be negative, got {self.weight_decay}.")
        if not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ProbeError(f"lr_min_ratio must be in [0, 1], got {self.lr_min_ratio}.")
        if not 0 <= self.seed < 2**63:
            raise ProbeError(f"seed must be in [0, 2**63), got {self.seed}.")
        if self.warmup < 0 or self.eval_every < 0 or self.stats_every < 0:
            raise ProbeError("warmup, eval_every and stats_every must not be negative.")
        if self.schedule == Schedule.PAPER and self.warmup < 1:
            raise ProbeError("the paper's schedule needs warmup of at least 1 step.")
        if not self.grad_clip >= 0:
            raise ProbeError(f"grad_clip must be 0 (off) or positive, got {self.grad_clip}.")
        if not self.adam_eps > 0:
            raise ProbeError(f"adam_eps must be positive, got {self.adam_eps}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ProbeError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}.")
        check_device_name(self.device)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return from_dict(cls, data, "train")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)
