"""`probe study run | ls | validate | report`: declarative studies."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from probe_cli.common import DeviceOpt, DtypeOpt, Group, console, err_console, shown
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from probe.errors import ProbeError
from probe.files import claim_file
from probe.study.documents import read_toml
from probe.words import counted

if TYPE_CHECKING:  # the study modules import torch: commands import them when they run
    from probe.study.engine import Event
    from probe.study.verdicts.expect import Outcome

app = typer.Typer(
    help="Declarative studies: train a grid of models, analyse them, write a report.",
    no_args_is_help=True,
    cls=Group,
)

StudyArg = Annotated[Path, typer.Argument(help="A study file, e.g. studies/quickstart.toml.")]
SmokeOpt = Annotated[
    bool, typer.Option("--smoke", help="Run the scaled-down version (its \\[smoke] table; for CI).")
]


class UnitProgress:
    """Renders the engine's Events: one bar over the units (cells, steps), one per running
    unit."""

    def __init__(self, bar: Progress, noun: str) -> None:
        self.bar = bar
        self.noun = noun
        self.overall: TaskID | None = None
        self.running: dict[int, TaskID] = {}

    def __call__(self, event: Event) -> None:
        bar = self.bar
        if event.kind == "start":
            self.overall = bar.add_task(f"[bold]{self.noun}s", total=event.n_units, note="")
        elif event.kind == "unit-start":
            self.running[event.index] = bar.add_task(f"  {shown(event.label)}", total=None, note="")
        elif event.kind == "unit" and event.index in self.running:
            bar.update(self.running[event.index], completed=event.done, total=event.total,
                       note=f"{event.phase} {event.note}".strip())  # fmt: skip
        elif event.kind == "unit-stale":
            bar.console.print(f"  [yellow]recomputing[/] {shown(event.label)}: {event.note}")
        elif event.kind == "unit-done":
            task = self.running.pop(event.index, None)
            if task is not None:
                bar.remove_task(task)
            if event.cached:
                bar.console.print(f"  [dim]cached[/] {shown(event.label)}")
            bar.advance(self.overall)


def show_outcomes(outcomes: list[Outcome]) -> None:
    view = Table(title="expectations")
    for column, justify in (("check", "left"), ("observed", "right"), ("expected", "left"),
                            ("result", "left")):  # fmt: skip
        view.add_column(column, justify=justify)
    for o in outcomes:
        observed = "–" if o.observed is None else f"{o.observed:.3f}"
        result = "[green]pass[/]" if o.passed else f"[bold red]FAIL[/] {shown(o.detail)}".strip()
        view.add_row(shown(o.name), observed, o.bound, result)
    console.print(view)


def run_cli(
    file: StudyArg,
    smoke: SmokeOpt = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Cells run in parallel.")] = 1,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Results directory (default runs/NAME; results/NAME is the committed reference).",
        ),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    threads: Annotated[int, typer.Option(help="torch CPU threads per cell.")] = 1,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Write the expectations as JUnit XML here.")
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Write into a folder that holds other files or another study's results.",
        ),
    ] = False,
    executor: Annotated[
        str,
        typer.Option(
            help="local (this machine: --jobs processes) or ray (each cell a task on a Ray "
            "cluster; pip install 'probe\\[ray]')."
        ),
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(
            help="Ray: the cluster to join ('auto': the one running here); default: "
            "start a local one."
        ),
    ] = None,
) -> None:
    """Run a study (finished cells or steps are reused), write its report and check its
    expectations; exit code 1 when an expectation fails."""
    read_toml(file)  # a study file that is not there, or not TOML: one line before torch loads
    from probe.study.engine import Settings
    from probe.study.runner import prepare

    if junit is not None:
        claim_file(junit, overwrite=True, what="--junit", inputs={"the study file": file})
    settings = Settings(device, dtype, threads, jobs, executor, address)
    ready = prepare(file, out, smoke=smoke, settings=settings)  # every check, before any output
    console.print(f"study [bold]{shown(ready.study.name)}[/]{' (smoke)' if smoke else ''}: "
                  f"{shown(ready.describe())} -> {shown(ready.out)}")  # fmt: skip
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console) as bar:
        done = ready.run(UnitProgress(bar, ready.plan.noun), overwrite=overwrite)
    result = done.result
    seconds = float(result.manifest["wall_s"])
    trained = [not r.cached and r.facts["train_s"] > 0 for r in result.records
               if "train_s" in r.facts]  # fmt: skip
    models = f" ({counted(sum(trained), 'model')} trained)" if trained else ""
    console.print(f"{counted(result.n_run, ready.plan.noun)} run{models}, {result.n_cached} "
                  f"reused from the cache, {seconds:.0f} s")  # fmt: skip
    console.print(f"report: [bold]{shown(done.report)}[/]", soft_wrap=True)
    finish(done.study.name, done.outcomes, junit, seconds, done.verdict)


def finish(name: str, outcomes: list[Outcome], junit: Path | None, seconds: float,
           last: str = "") -> None:  # fmt: skip
    """Show the expectations, write them as JUnit XML, print `last` (the reproduction verdict
    of a run) as the last line, exit 1 when an expectation failed."""
    from probe.study.verdicts.expect import write_junit

    if outcomes:
        show_outcomes(outcomes)
    if junit is not None:
        write_junit(junit, name, outcomes, seconds)
        console.print(f"JUnit XML: {shown(junit)}")
    failed = [o for o in outcomes if not o.passed]
    if failed:
        err_console.print(f"[bold red]{len(failed)} of {len(outcomes)} expectations failed[/]")
    if last:
        console.print(f"[bold]Reproduction.[/] {shown(last)}", soft_wrap=True, highlight=False)
    if failed:
        raise SystemExit(1)


def ls_cli(
    folder: Annotated[Path, typer.Argument(help="Folder of study files.")] = Path("studies"),
) -> None:
    """List the study files in a folder with their question and size."""
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ProbeError(f"No study files (*.toml) in '{folder}'.")
    from probe.study.kinds import describe, load_any

    view = Table(title=shown(f"studies in {folder}"))
    for column in ("file", "name", "size", "smoke", "question"):
        view.add_column(column, overflow="fold")
    for path in files:
        try:
            study = load_any(path)
        except ProbeError as exc:
            view.add_row(shown(path), "[red]invalid[/]", "", "", shown(exc))
            continue
        full, smoke = describe(study)
        view.add_row(shown(path), shown(study.name), full, smoke or "–",
                     shown(study.question))  # fmt: skip
    console.print(view)


def validate_cli(
    paths: Annotated[list[Path], typer.Argument(help="Study files to check, or folders of them.")],
) -> None:
    """Check study files (every cell's configuration is built); exit code 2 if one is invalid."""
    files = [f for p in paths for f in (sorted(p.glob("*.toml")) if p.is_dir() else [p])]
    if not files:
        raise ProbeError(f"No study files (*.toml) in {', '.join(map(str, paths))}.")
    if len(files) == 1:
        read_toml(files[0])  # not there, or not TOML: its one line before torch loads
    from probe.study.kinds import describe, load_any

    errors = []
    for path in files:
        try:
            study = load_any(path)
        except ProbeError as exc:
            problem = str(exc) if str(path) in str(exc) else f"{path}: {exc}"
            if len(files) == 1:
                raise ProbeError(problem) from None  # one file: its problem is the one line
            errors.append(problem)
            err_console.print(f"[bold red]invalid[/] {shown(problem)}", highlight=False,
                              soft_wrap=True)  # fmt: skip
            continue
        full, smoke = describe(study)
        smoke = f", smoke {smoke}" if smoke else ""
        console.print(f"[green]ok[/] {shown(path)}: {full}{smoke}", soft_wrap=True)
    if errors:
        raise ProbeError(f"{len(errors)} of {len(files)} study files are invalid.")


def report_cli(
    folder: Annotated[Path, typer.Argument(help="A results directory of `probe study run`.")],
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Write the expectations as JUnit XML here.")
    ] = None,
    partial: Annotated[
        bool, typer.Option("--partial", help="Report on the finished cells of an unfinished run.")
    ] = False,
    viewers: Annotated[
        bool,
        typer.Option(
            "--viewers/--no-viewers",
            help="Also write a head viewer per cell whose model is kept (viewers/index.html).",
        ),
    ] = True,
) -> None:
    """Rebuild a study's report (report.md and report.html; expectations rechecked) from its
    results directory, and a head viewer page for each cell whose trained model is kept."""
    from probe.study.grid.report import read_manifest
    from probe.study.kinds import rebuild_report

    kind, (path, outcomes) = rebuild_report(folder, partial=partial)
    console.print(f"report: [bold]{shown(path)}[/] (and {path.with_suffix('.html').name})",
                  soft_wrap=True)  # fmt: skip
    if viewers and kind.viewers:
        _viewers(folder)
    finish(read_manifest(folder)["study"], outcomes, junit, 0.0)


def _viewers(folder: Path) -> None:
    from probe.study.grid.viewers import VIEWERS, write_viewers

    with Progress(TextColumn("viewers"), BarColumn(), MofNCompleteColumn(),
                  console=console, transient=True) as bar:  # fmt: skip
        job = bar.add_task("viewers", total=None)
        pages = write_viewers(folder, lambda done, total: bar.update(job, completed=done,
                                                                     total=total))  # fmt: skip
    if pages:
        index = shown(folder / VIEWERS / "index.html")
        console.print(f"viewers: [bold]{index}[/] ({counted(len(pages), 'cell')})", soft_wrap=True)


app.command("run", epilog="Example: probe study run studies/quickstart.toml --smoke")(run_cli)
app.command("ls", epilog="Example: probe study ls studies")(ls_cli)
app.command("validate", epilog="Example: probe study validate studies")(validate_cli)
app.command("report", epilog="Example: probe study report runs/quickstart")(report_cli)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="study")
