"""What the engine runs: units of work, the plan a study kind makes of them, the settings a run
takes, the record of a finished unit and the progress events of a run."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

# (phase, done, total, note): progress inside a unit
Progress = Callable[[str, int, int, str], None]


@dataclass(frozen=True)
class Settings:
    """How a run computes: where (device), in which dtype (None: each kind's default), with how
    many torch threads per unit, and how many units at once on which executor."""

    device: str = "auto"
    dtype: str | None = None
    threads: int = 1
    jobs: int = 1
    executor: str = "local"  # local | ray
    address: str | None = None  # Ray: the cluster to join (None: start a local one)


@dataclass(frozen=True)
class Unit(ABC):
    """One cached piece of a study: `key` names its folder, `digest` says when a finished copy is
    still valid (a hash of everything it depends on), `run` computes its tables. Units travel to
    worker processes and Ray tasks, so they hold data, not closures."""

    index: int  # position in the plan, so tables gather in plan order
    key: str
    label: str
    digest: str

    @abstractmethod
    def run(self, context: Any, progress: Progress) -> tuple[dict[str, pd.DataFrame], dict]:
        """(tables by name, facts for done.json) of this unit, computed with the plan's
        per-process `context`."""


class Plan(ABC):
    """A study kind's plan: which units, in which folder, built on which per-process context."""

    folder: str  # the cache's folder under the results directory: cells/, steps/
    noun: str  # what a unit is called in messages: cell, step

    def __init__(self, study: Any, root: Path, settings: Settings) -> None:
        self.study = study
        self.root = root
        self.settings = settings

    @abstractmethod
    def units(self, finished: dict[str, list[pd.DataFrame]]) -> list[Unit]:
        """The next units to run, given the tables of every unit finished so far (by name, in
        plan order); [] when the plan is complete. Most kinds plan everything in the first call;
        a unit that depends on earlier results (a head study's timing) comes in a later one."""

    @abstractmethod
    def context(self) -> Any:
        """What every unit of this plan shares within one process (built lazily, once per
        process: a head study's imported model; a grid study needs none)."""

    @abstractmethod
    def manifest(self, records: list[Record], run: dict[str, Any]) -> dict[str, Any]:
        """manifest.json: `run` holds what the engine knows (provenance, settings, wall_s)."""

    @abstractmethod
    def study_dict(self) -> dict[str, Any]:
        """study.json: the (possibly smoke) study as it ran."""

    def context_key(self) -> tuple:
        """What makes two plans' contexts the same (a worker process reuses its context)."""
        return ()

    def size(self) -> int:
        """How many units the plan runs in all (for progress)."""
        return len(self.units({}))

    def inputs(self) -> tuple[Path, ...]:
        """Files the run reads (never to be written into)."""
        return ()


@dataclass(frozen=True)
class Record:
    """A finished unit: its tables' names, seconds, whether it came from the cache, the code that
    computed it and what else its done.json holds."""

    index: int
    key: str
    digest: str
    tables: tuple[str, ...]
    seconds: float
    cached: bool
    git_commit: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """Progress of a run: kind is "start" (n_units), "unit-start", "unit" (inside a unit:
    phase, done, total, note), "unit-done" (cached says whether it was reused) or "unit-stale"
    (a unit whose finished copy is damaged or out of date, said in `note`: it is computed
    again)."""

    kind: str
    n_units: int
    index: int = -1
    label: str = ""
    phase: str = ""
    done: int = 0
    total: int = 0
    note: str = ""
    cached: bool = False
