"""What an analysis step of a grid study is: the context it runs in (`StepContext`), the step
(`Step`: its options, run function, option checks, tables and report sections) and a report
section (`Section`: its place in the report, the tables it needs, what it writes).

A step module declares one `STEP = Step(...)`; the package (`probe.study.grid.steps`) finds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from probe.data.tasks import TaskConfig, parse_lengths
from probe.errors import ProbeError
from probe.model import Transformer
from probe.report.report import MarkdownReport
from probe.study.grid.definition import Study
from probe.train_config import TrainConfig

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


@dataclass(frozen=True)
class Given:
    """What a report section reads: the study's tables (every cell's rows, by table name), its
    arms in the order the study file names them, and the study."""

    tables: dict[str, pd.DataFrame]
    order: list[str]
    study: Study


@dataclass(frozen=True)
class Section:
    """A part of the report presenting a step's tables. The report writes the sections of the
    study's steps by `place` (lower first; the training section and the verdicts follow them),
    each only when the study has every table it `needs` and it `applies` to the study."""

    name: str
    place: int  # unique over all sections: the report's order
    needs: tuple[str, ...]  # the tables it presents
    write: Callable[[MarkdownReport, Given], list[str]]  # writes it; returns its findings
    answers: bool = False  # its first finding answers the study's question (the Answer line)
    applies: Callable[[Study], bool] | None = None  # None: every study with the tables

    def wanted(self, study: Study, tables: dict[str, pd.DataFrame]) -> bool:
        if any(name not in tables for name in self.needs):
            return False
        return self.applies is None or self.applies(study)


@dataclass(frozen=True)
class Step:
    name: str  # its [analysis.NAME] table in a study file
    options: type  # frozen dataclass of its options (their values go into the cell's key)
    run: Callable[[StepContext, Any], dict[str, pd.DataFrame]]
    tables: tuple[str, ...]  # the tables the step returns
    doc: str
    check: Callable[[Any], None] | None = None  # more validation of the options
    sections: tuple[Section, ...] = ()  # the report sections presenting its tables
