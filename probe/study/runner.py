"""Running a study of either kind through the one engine: its plan, then `run_plan`.

result = run_study(study, "results/quickstart", jobs=2)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from probe.errors import ProbeError
from probe.study.engine import Event, Plan, RunResult, Settings, run_plan
from probe.study.engine.runner import finished_tables, load_tables
from probe.study.engine.workdir import LOCK, MANIFEST, locked
from probe.study.grid.plan import GridPlan
from probe.study.grid.spec import Study
from probe.study.heads.plan import HeadPlan
from probe.study.heads.spec import HeadStudy

__all__ = ["LOCK", "MANIFEST", "finished_tables", "load_tables", "locked", "plan_for",
           "run_study"]  # fmt: skip

# study kind -> its planner: a new kind of study is a new planner (and its steps)
PLANNERS: dict[type, type[Plan]] = {Study: GridPlan, HeadStudy: HeadPlan}


def plan_for(study: Study | HeadStudy, out: Path | str, settings: Settings | None = None) -> Plan:
    """The plan of `study` into results directory `out`."""
    planner = PLANNERS.get(type(study))
    if planner is None:
        raise ProbeError(f"no planner for a study of type {type(study).__name__}.")
    return planner(study, Path(out), settings or Settings())


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
    if dtype is not None and not isinstance(study, HeadStudy):
        raise ProbeError("--dtype sets the weights' dtype of a head study's real model; a grid "
                         "study trains its models in float32 (bf16 autocast on CUDA): drop "
                         "--dtype.")  # fmt: skip
    settings = Settings(device, dtype, threads, jobs, executor, address)
    plan = plan_for(study, out, settings)
    text = study.path.read_text(encoding="utf-8") if study.path is not None else None
    return run_plan(plan, progress=progress, overwrite=overwrite, study_text=text)
