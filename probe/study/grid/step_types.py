"""What every analysis step of a study is: the context it runs in, its registry entry, and the
helpers steps share (length specs, optional parts of probe)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from probe.config import TrainConfig
from probe.data.tasks import TaskConfig, parse_lengths
from probe.errors import ProbeError
from probe.model import Transformer

Progress = Callable[[int, int], None]


@dataclass
class StepContext:
    model: Transformer  # trained, in eval mode
    task: TaskConfig
    train: TrainConfig
    device: torch.device
    progress: Progress | None = None  # (done, total) within the step

    @property
    def train_max(self) -> int:
        """L: the longest training length."""
        return self.train.train_len[1]


def resolve_lengths(spec: str | list[int], train_max: int) -> list[int]:
    """Lengths from a spec such as "1:2L", "4:L,24,32" or [8, 16]; `L` is the longest training
    length and `kL` is k times it."""
    if isinstance(spec, list | tuple):
        return parse_lengths(",".join(str(int(n)) for n in spec))
    if not isinstance(spec, str):
        raise ProbeError(f"lengths must be a string like '1:2L' or a list, got {spec!r}.")
    text = re.sub(r"(\d*)L", lambda m: str(int(m.group(1) or 1) * train_max), spec)
    return parse_lengths(text)


def require(step: str, module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise
        raise ProbeError(
            f"analysis '{step}' needs {module}, which this installation of probe does not have; "
            f"remove [analysis.{step}] from the study or update probe."
        ) from None


@dataclass(frozen=True)
class Step:
    name: str
    options: type
    run: Callable[[StepContext, Any], dict[str, pd.DataFrame]]
    tables: tuple[str, ...]  # the tables the step returns
    doc: str
    check: Callable[[Any], None] | None = None  # more validation of the options
