"""The kinds of study, in one registry: how a study file is recognised and read, its smoke
version, its size, the plan the engine runs and the report it ends with.

A grid study (`[base]`) trains a grid of models and analyses each; a head study (`[model]
source`) measures the heads of one imported model. A new kind of study is one `Kind` here, with
its planner (a `probe.study.engine.Plan`) and its steps: the runner, the cache, the executors,
the expectations, the JUnit output and the reproduction check serve it as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.study.documents import read_toml
from probe.study.engine import Plan, RunResult
from probe.study.grid.cells import expand
from probe.study.grid.plan import GridPlan
from probe.study.grid.report import read_manifest, report_from_dir, write_report
from probe.study.grid.spec import Study, parse_study, smoke_version
from probe.study.heads.plan import HeadPlan
from probe.study.heads.report import write_head_report
from probe.study.heads.reproduction import head_reproduction
from probe.study.heads.spec import HeadStudy, parse_head_study, smoke_head_study
from probe.study.heads.steps import step_count
from probe.study.verdicts.expect import Outcome
from probe.study.verdicts.reproduce import reproduction

Report = tuple[Path, list[Outcome]]


@dataclass(frozen=True)
class Kind:
    name: str  # the manifest's "kind"
    study: type  # the study's class
    claims: Callable[[dict[str, Any]], bool]  # whether a parsed study file is of this kind
    parse: Callable[[dict[str, Any], Path | None], Any]
    smoke: Callable[[Any], Any]  # the study with its [smoke] table applied
    planner: type[Plan]
    size: Callable[[Any], int]  # how many units a run has
    describe: Callable[[Any, int], str]  # "4 cells", "bundled:minilm, 62 steps"
    report: Callable[[Path, Any, RunResult], Report]  # after a run
    rebuild: Callable[[Path, bool], Report]  # from a results directory alone (partial or not)
    viewers: bool  # whether its results keep trained models to view (a grid study's cells)
    reproduce: Callable[[dict, dict, Path], str]  # (tables, manifest, reference) -> a sentence


def _head_rebuild(out: Path, partial: bool) -> Report:
    if partial:
        raise ProbeError(
            "--partial reports the finished cells of a grid study; a head study's report needs "
            "every step: run the study again to finish it (finished steps are kept)."
        )
    return write_head_report(out)


KINDS = (
    Kind("grid", Study, lambda data: "base" in data, parse_study, smoke_version, GridPlan,
         lambda s: len(expand(s)), lambda s, n: f"{n} cell{'s' * (n != 1)}",
         lambda out, s, result: write_report(out, s, result.tables, result.manifest),
         lambda out, partial: report_from_dir(out, partial=partial), True, reproduction),
    Kind("heads", HeadStudy, lambda data: "model" in data and "base" not in data,
         parse_head_study, smoke_head_study, HeadPlan, step_count,
         lambda s, n: f"{s.source}, {n} step{'s' * (n != 1)}",
         lambda out, s, result: write_head_report(out), _head_rebuild, False, head_reproduction),
)  # fmt: skip


def kind_of(study: Any) -> Kind:
    for kind in KINDS:
        if isinstance(study, kind.study):
            return kind
    raise ProbeError(f"no kind of study is a {type(study).__name__}.")


def load_any(path: str | Path) -> Any:
    """A study file as the kind it is: a head study (`[model] source`) or a grid study
    (`[base]`; also what a file with neither is read as, so its error names `[base]`)."""
    path = Path(path)
    data = read_toml(path)
    kind = next((k for k in KINDS if isinstance(data, dict) and k.claims(data)), KINDS[0])
    return kind.parse(data, path)


def smoke_of(study: Any, file: Path | str) -> Any:
    """The smoke version of `study` (one line when it has no [smoke] table)."""
    if study.smoke is None:
        raise ProbeError(f"{file} has no [smoke] section; run it without --smoke.")
    return kind_of(study).smoke(study)


def describe(study: Any) -> tuple[str, str]:
    """(the study's size, its smoke version's unit count or '' without [smoke])."""
    kind = kind_of(study)
    smoke = str(kind.size(kind.smoke(study))) if study.smoke is not None else ""
    return kind.describe(study, kind.size(study)), smoke


def rebuild_report(out: Path | str, partial: bool = False) -> tuple[Kind, Report]:
    """The report of a results directory of either kind, from its own files."""
    manifest = read_manifest(out)
    kind = next((k for k in KINDS if k.name == manifest.get("kind", "grid")), None)
    if kind is None:
        raise ProbeError(f"{out}: its manifest names a study kind probe does not know "
                         f"('{manifest.get('kind')}').")  # fmt: skip
    return kind, kind.rebuild(Path(out), partial)
