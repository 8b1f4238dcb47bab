"""Running a study of either kind through the one engine: its plan, then `run_plan`.

result = run_study(study, "results/quickstart", jobs=2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from probe.study.engine import Event, Plan, RunResult, Settings, run_plan
from probe.study.engine.runner import finished_tables, load_tables
from probe.study.engine.workdir import LOCK, MANIFEST, locked
from probe.study.grid.spec import Study
from probe.study.heads.spec import HeadStudy
from probe.study.kinds import kind_of

if TYPE_CHECKING:
    from probe.study.verdicts.expect import Outcome

__all__ = ["LOCK", "MANIFEST", "Prepared", "StudyRun", "finished_tables", "load_tables",
           "locked", "plan_for", "prepare", "run", "run_study"]  # fmt: skip


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


@dataclass(frozen=True)
class StudyRun:
    """A finished study: its results, the report written and what was judged."""

    study: Study | HeadStudy
    out: Path
    result: RunResult
    report: Path  # report.md
    outcomes: list[Outcome]  # the study's expectations, each passed or not
    verdict: str  # the reproduction verdict against the committed reference (a sentence)

    @property
    def passed(self) -> bool:
        """Whether every expectation held."""
        return all(o.passed for o in self.outcomes)


@dataclass(frozen=True)
class Prepared:
    """A study read, checked and planned, nothing run yet: what `run` does first, apart so a
    caller can say what is about to run (`describe`, `plan.size()`, `plan.noun`)."""

    study: Study | HeadStudy
    out: Path
    plan: Plan

    def describe(self) -> str:
        """What the study runs, in a few words ("9 steps on bundled:smollm2")."""
        return kind_of(self.study).describe(self.study, self.plan.size())

    def run(
        self, progress: Callable[[Event], None] | None = None, overwrite: bool = False
    ) -> StudyRun:
        """Run (or resume) every unit, write the report, judge the expectations and the
        reproduction of the committed reference."""
        from probe.study.verdicts.reproduce import verdict

        study, kind = self.study, kind_of(self.study)
        result = run_plan(self.plan, progress=progress, overwrite=overwrite)
        report, outcomes = kind.report(self.out, study, result)
        last = verdict(self.out, study.name, study.is_smoke, result.tables, result.manifest,
                       kind.reproduce)  # fmt: skip
        return StudyRun(study, self.out, result, report, outcomes, last)


def prepare(
    path: Path | str,
    out: Path | str | None = None,
    *,
    smoke: bool = False,
    settings: Settings | None = None,
) -> Prepared:
    """The study file at `path` read and checked, its smoke version if `smoke`, planned into
    `out` (default runs/NAME), the settings checked (devices, --jobs, a Ray address) and the
    results folder checked against the study's inputs: every mistake one line, before any
    output."""
    from probe.files import check_output_dir
    from probe.runtime import Runtime
    from probe.study.engine.runner import check_settings
    from probe.study.heads.checks import check_threads
    from probe.study.kinds import load_any, smoke_of

    settings = settings or Settings()
    Runtime.resolve(settings.device, settings.dtype)  # a bad name is one line now
    check_threads(settings.threads, "--threads")
    study = load_any(path)
    if smoke:
        study = smoke_of(study, path)
    out = Path(out) if out is not None else default_out(study)
    plan = plan_for(study, out, settings)  # refuses what the kind cannot do
    check_settings(plan)
    # a head study's results may lie inside its model's folder, never the other way round
    inputs = [("the study file", Path(path)), *(("the study's input", p) for p in plan.inputs())]
    check_output_dir(out, inputs=inputs, inside_ok=True)
    return Prepared(study, out, plan)


def run(
    path: Path | str,
    out: Path | str | None = None,
    *,
    smoke: bool = False,
    settings: Settings | None = None,
    progress: Callable[[Event], None] | None = None,
    overwrite: bool = False,
) -> StudyRun:
    """Run a study file in one call, as `probe study run` does: read, check, plan, run (finished
    units reused), report and judge. `settings`: device, dtype, threads, jobs, executor."""
    return prepare(path, out, smoke=smoke, settings=settings).run(progress, overwrite)


def default_out(study: Study | HeadStudy) -> Path:
    """runs/NAME (git-ignored; runs/NAME-smoke for a smoke run): a run never rewrites the
    committed results/NAME, which is the reference its report compares with; an `out` of
    results/NAME updates the reference."""
    return Path("runs") / (f"{study.name}-smoke" if study.is_smoke else study.name)
