"""Running a study of either kind through the one engine: its plan, then `run_plan`.

result = run_study(study, "results/quickstart", jobs=2)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from probe.study.engine import Event, Plan, RunResult, Settings, run_plan
from probe.study.engine.runner import finished_tables, load_tables
from probe.study.engine.workdir import LOCK, MANIFEST, locked
from probe.study.grid.spec import Study
from probe.study.heads.spec import HeadStudy
from probe.study.kinds import kind_of

__all__ = ["LOCK", "MANIFEST", "finished_tables", "load_tables", "locked", "plan_for",
           "run_study"]  # fmt: skip


def plan_for(study: Study | HeadStudy, out: Path | str, settings: Settings | None = None) -> Plan:
    """The plan of `study` into results directory `out`."""
    return kind_of(study).planner(study, Path(out), settings or Settings())


def run_study(
    study: Study | HeadStudy,
    out: Path | str,
    *,
    jobs: int = 1,
    device: str = "auto",
    dtype: str | None = None,
    threads: int = 1,
    progress: Callable[[Event], None] | None = None,
    overwrite: bool = False,
    executor: str = "local",
    address: str | None = None,
) -> RunResult:
    """Run (or resume) every unit of `study` (the cells of a grid study, the steps of a head
    study) into results directory `out`.

    jobs: units run at once, each in its own process (1: in this process). threads: torch CPU
    threads per unit; one is fastest for the small models of the shipped grid studies (the cores
    are better spent on --jobs). executor "ray" sends each uncached unit to a Ray cluster as a
    task (`address`: the cluster's, or None for a local one). dtype: the weights' dtype of a
    head study's model (None: its own); a grid study trains in float32."""
    settings = Settings(device, dtype, threads, jobs, executor, address)
    return run_plan(plan_for(study, out, settings), progress=progress, overwrite=overwrite)
