"""The settings of one healing run (`probe heal`'s options, a study's [heal] section), checked
on their own: no torch here, so the command line answers a bad value before it loads a model."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from probe.errors import ProbeError

SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class HealConfig:
    tokens: int  # training tokens: whole steps of `batch_tokens` up to this many
    seq_len: int = 512  # tokens per row
    batch_tokens: int = 16384  # tokens per optimizer step (whole rows)
    lr: float = 1e-4  # peak learning rate (AdamW)
    warmup: float = 0.1  # share of the steps warming up linearly from 0
    schedule: str = "constant"  # after warm-up: constant, or cosine down to lr / 10
    weight_decay: float = 0.01  # AdamW, on matrices only
    temperature: float = 1.0  # of both distributions in the KL loss
    hidden_weight: float = 0.0  # weight of the per-block hidden-state loss (0: logits only)
    eval_tokens: int = 32768  # held-out tokens perplexity is measured on
    eval_at: tuple[int, ...] | None = None  # steps measured after (None: 1, 2, 4, ..., last)
    seed: int = 0  # order of the training rows

    def __post_init__(self) -> None:
        for name in ("tokens", "seq_len", "batch_tokens", "eval_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProbeError(f"--{name.replace('_', '-')} must be a whole number of at "
                                 f"least 1, got {value!r}.")  # fmt: skip
        if self.seq_len < 2:
            raise ProbeError(f"--seq-len must be at least 2, got {self.seq_len}.")
        if self.batch_tokens < self.seq_len:
            raise ProbeError(f"--batch-tokens {self.batch_tokens} is less than one row of "
                             f"--seq-len {self.seq_len}; raise it or shorten rows.")  # fmt: skip
        if self.tokens < self.step_tokens:
            raise ProbeError(f"--tokens {self.tokens} is less than one optimizer step of "
                             f"{self.step_tokens} tokens (--batch-tokens); raise it.")  # fmt: skip
        if self.eval_tokens < self.seq_len:
            raise ProbeError(f"--eval-tokens {self.eval_tokens} is less than one row of "
                             f"--seq-len {self.seq_len}.")  # fmt: skip
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ProbeError(f"--lr must be above 0, got {self.lr}.")
        if not 0.0 <= self.warmup < 1.0:
            raise ProbeError(f"--warmup is a share of the steps in [0, 1), got {self.warmup}.")
        if self.schedule not in SCHEDULES:
            raise ProbeError(f"Unknown --schedule '{self.schedule}'; use {' or '.join(SCHEDULES)}.")
        for name in ("weight_decay", "hidden_weight"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ProbeError(f"--{name.replace('_', '-')} must be a finite number of at "
                                 f"least 0, got {value}.")  # fmt: skip
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ProbeError(f"--temperature must be above 0, got {self.temperature}.")
        if self.eval_at is not None:
            steps = tuple(sorted({int(s) for s in self.eval_at}))
            if not steps or steps[0] < 1 or steps[-1] > self.steps:
                raise ProbeError(f"evaluation steps must lie in 1..{self.steps}, got "
                                 f"{list(self.eval_at)}.")  # fmt: skip
            object.__setattr__(self, "eval_at", steps)

    @property
    def rows_per_step(self) -> int:
        return self.batch_tokens // self.seq_len

    @property
    def step_tokens(self) -> int:
        return self.rows_per_step * self.seq_len

    @property
    def steps(self) -> int:
        return self.tokens // self.step_tokens

    @property
    def eval_steps(self) -> tuple[int, ...]:
        if self.eval_at is not None:  # the trained model is always measured
            return tuple(sorted({*self.eval_at, self.steps}))
        doubling = [2**k for k in range(self.steps.bit_length()) if 2**k < self.steps]
        return (*doubling, self.steps)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based)."""
        warm = round(self.warmup * self.steps)
        if step < warm:
            return self.lr * (step + 1) / warm
        if self.schedule == "constant":
            return self.lr
        progress = (step - warm) / max(1, self.steps - warm - 1)  # 1 at the last step
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["eval_at"] = list(self.eval_steps)
        return data
