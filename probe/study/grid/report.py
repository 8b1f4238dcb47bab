"""A study's report: results/NAME/report.md with its tables and figures beside it.

The report opens with the question and the findings stated plainly, then the set-up, the
sections of the study's steps in their registered order (each step's module in
`probe.study.grid.steps` owns the sections presenting its tables: accuracy by length, attention
entropy, pruning, the comparison with published numbers, ...), the training section every grid
study has, the expectations and what produced the files. It is rebuilt from the results
directory alone (`probe study report DIR`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd

from probe.errors import ProbeError
from probe.model import Transformer
from probe.report import study_plots as plots
from probe.report.report import MarkdownReport
from probe.study.documents import read_json
from probe.study.engine import Settings
from probe.study.engine.runner import finished_tables, load_tables
from probe.study.engine.workdir import MANIFEST
from probe.study.grid.cells import expand
from probe.study.grid.plan import GridPlan
from probe.study.grid.spec import Study, load_study, smoke_version
from probe.study.grid.steps import SECTIONS, Given, options_dict
from probe.study.grid.steps.shared import wide_table
from probe.study.verdicts import summary
from probe.study.verdicts.checks import report_verdicts
from probe.study.verdicts.expect import Outcome
from probe.study.verdicts.reproduce import reference_for, reproduction
from probe.study.verdicts.stats import band_words, seed_counts
from probe.words import counted


def arm_order(study: Study) -> list[str]:
    """Arms in the order the study file names them: the `by` axis, then the variants."""
    seen: list[str] = []
    for cell in expand(study):
        if cell.arm not in seen and not cell.variant:
            seen.append(cell.arm)
    return seen + [v.name for v in study.variants]


def _settings(values: dict[str, Any]) -> str:
    return ", ".join(f"`{k} = {json.dumps(v)}`" for k, v in values.items()) or "defaults"


def _setup(rep: MarkdownReport, study: Study, manifest: dict[str, Any]) -> None:
    cells = expand(study)
    first = cells[0]
    params = Transformer(first.model).parameter_counts()["total"]
    rep.heading("Set-up")
    model, train = first.model, first.train
    items = [
        f"Model: {model.arch} with {model.n_layer} layer(s), {counted(model.n_head, 'head')}, "
        "d_model "
        f"{model.d_model}, {model.norm}-LN, positions {model.pe}, {counted(params, 'parameter')} "
        f"(for {first.task.name}; the vocabulary follows the task). Base settings: "
        f"{_settings(study.base['model'])}.",
        f"Task: {_settings(study.base['task'])}.",
        f"Training: {counted(train.steps, 'step', grouped=False)}, batch {train.batch_size}, "
        f"lr {train.lr}, lengths "
        f"{train.train_len[0]} to {train.train_len[1]} (L = {train.train_len[1]}). Base "
        f"settings: {_settings(study.base['train'])}.",
    ]
    counts: dict[str, int] = {}
    for cell in cells:  # arms that differ in size say so (per the first task's vocabulary)
        if cell.task.name == first.task.name and cell.arm not in counts:
            counts[cell.arm] = Transformer(cell.model).parameter_counts()["total"]
    if len(set(counts.values())) > 1:
        sizes = ", ".join(f"{arm} {n:,}" for arm, n in counts.items())
        items.append(f"Parameters per arm (for {first.task.name}): {sizes}.")
    for key, values in study.grid.items():
        items.append(f"Grid `{key}`: {', '.join(str(v) for v in values)}.")
    for v in study.variants:
        text = f"Variant **{v.name}**: {_settings(v.overrides)}"
        items.append(text + (f" ({v.description})." if v.description else "."))
    for o in study.overrides:
        when = " and ".join(f"`{k}` in {list(v)}" for k, v in o.where.items())
        items.append(f"Where {when}: {_settings(o.overrides)}.")
    for name, options in study.analysis.items():
        items.append(f"Analysis `{name}`: {_settings(options_dict(options))}.")
    seeds = ", ".join(str(s) for s in manifest.get("seeds", []))
    models = "model" if len(cells) == 1 else "models"
    items.append(f"{counted(len(cells), 'cell')} ({models}), seeds {seeds}; {_run_line(manifest)}.")
    rep.bullets(items)


def _run_line(manifest: dict[str, Any]) -> str:
    wall = sum(c.get("wall_s") or 0 for c in manifest.get("cells", []))
    spent = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.0f} min"
    return (f"run on {manifest.get('device', '?')}, git {manifest.get('git_commit') or 'unknown'}, "
            f"{manifest.get('created', '?')}, {spent} of cell time")  # fmt: skip


def write_report(
    out: Path | str,
    study: Study,
    tables: dict[str, pd.DataFrame],
    manifest: dict[str, Any],
    missing: tuple[str, ...] = (),
) -> tuple[Path, list[Outcome]]:
    """Write out/report.md (+ CSV and PNG beside it); returns its path and the expectations'
    outcomes. `missing`: labels of unfinished cells, for a partial report that says so."""
    out = Path(out)
    title = study.title or f"Study: {study.name}"
    rep = MarkdownReport(out, title + (" (smoke run)" if study.is_smoke else ""))
    rep.paragraph(f"**Question.** {study.question}")
    question_at = len(rep.blocks)
    if study.description:
        rep.paragraph(study.description)
    if study.is_smoke:
        rep.paragraph("> This is the **smoke** version (scaled down for CI): the numbers check "
                      "that the pipeline works, not what the study finds.")  # fmt: skip
    if missing:
        n = len(expand(study))
        rep.paragraph(
            f"> **Partial report**: {n - len(missing)} of {counted(n, 'cell')} "
            f"{'is' if n - len(missing) == 1 else 'are'} finished; not yet: "
            f"{'; '.join(missing)}. Their numbers are absent and the expectations cover only "
            f"the finished cells. `probe study run {manifest.get('file', study.where)}"
            f"{' --smoke' if study.is_smoke else ''} --out {out}` finishes the run and "
            "rewrites this report."
        )
    findings_at = len(rep.blocks)
    _setup(rep, study, manifest)
    order = arm_order(study)
    findings: list[str] = []
    answers: list[str] = []
    given = Given(tables, order, study)
    for section in SECTIONS:  # the steps' sections in the report's order
        if section.wanted(study, tables):
            lines = section.write(rep, given)
            if section.answers:
                answers, lines = answers + lines[:1], lines[1:]
            findings += lines
    if "train" in tables:
        training(rep, tables["train"], order)
    verdicts, outcomes, verdict_findings = report_verdicts(rep, study.expectations, study.contrasts,
                                                  tables, study.is_smoke, study.where)  # fmt: skip
    answers += verdicts
    if answers:
        rep.blocks.insert(question_at, "**Answer.** " + "; ".join(answers) + ".")
        findings_at += 1
    findings += verdict_findings
    rep.heading("Files")
    rep.bullets([
        "`tables/*.csv`: every cell's tidy results, one row per seed, with the cell's identity "
        "columns (cell hash, arm, variant, grid factors, task, seed, L_min, L).",
        "`manifest.json`: config hash, seeds and wall time per cell, package versions, device, "
        "git commit. `study.toml` / `study.json`: the study as run.",
        f"Reproduce: `probe study run {manifest.get('file', study.where)}"
        f"{' --smoke' if study.is_smoke else ''}` "
        "(finished cells are reused from `cells/`).",
    ])  # fmt: skip
    rep.blocks.insert(findings_at, "## Findings\n\n" + "\n".join(f"- {f}" for f in findings))
    ref = reference_for(out, manifest.get("study", study.name), study.is_smoke)
    if ref is not None:
        rep.paragraph("**Reproduction.** " + reproduction(tables, manifest, ref))
    return rep.write(), outcomes


def training(rep: MarkdownReport, table: pd.DataFrame, order: list[str]) -> None:
    """Every cell's training log (the `train` table): loss, attention during training, final
    loss. Every grid study has it, whatever its steps."""
    loss = summary.training_loss(table, smooth=9)
    if loss.empty or loss["step"].nunique() < 2:  # nothing to draw (a model trained one step)
        return
    rep.heading("Training")
    rep.figure(
        plots.training_curves(loss, order=order),
        "training_loss.png",
        "Training loss against step (log scale; moving average over 9 logged steps)",
    )
    rep.data(loss, "training_loss.csv", "Smoothed training loss per seed.")
    stats = summary.attention_over_training(table)
    if not stats.empty:
        shown = [m for m in ("normalized_entropy", "max_logit", "p_max") if m in set(stats.metric)]
        drawn = stats[stats["metric"].isin(shown)]
        counts = seed_counts(drawn, ["metric", "arm", "step"], rows=True)
        rep.figure(plots.attention_training_curves(stats, shown, order=order),
                   "attention_during_training.png",
                   "Attention statistics during training, averaged over every head "
                   f"({band_words(counts, short=True)})")  # fmt: skip
        rep.data(stats, "attention_during_training.csv",
                 "Per-cell attention statistics by step (mean over heads).")  # fmt: skip
    final = summary.final_loss(table)
    rep.table(wide_table(final, order), "final_loss.csv", data=final,
              caption="Last logged training loss.")  # fmt: skip


def read_manifest(out: Path | str) -> dict[str, Any]:
    path = Path(out) / MANIFEST
    if not path.exists():
        raise ProbeError(f"{out} has no {MANIFEST}; is it the output of `probe study run`?")
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise ProbeError(
            f"{path} does not hold a JSON object; is it the output of `probe study run`?"
        )
    return manifest


def study_from_dir(out: Path | str) -> tuple[Study, dict[str, Any]]:
    """The study (its smoke version for a smoke run) and manifest of a results directory, read
    from the copy of the study file the run left there."""
    out = Path(out)
    manifest = read_manifest(out)
    if not (out / "study.toml").exists():
        raise ProbeError(f"{out} has no study.toml copy; rerun the study to rebuild its report.")
    study = dataclasses.replace(load_study(out / "study.toml"), name=manifest["study"])
    return (smoke_version(study) if manifest.get("smoke") else study), manifest


def report_from_dir(out: Path | str, partial: bool = False) -> tuple[Path, list[Outcome]]:
    """Rebuild the report of a finished results directory from its own files; with `partial`,
    of an unfinished one from its finished cells (the report says which are missing)."""
    out = Path(out)
    study, manifest = study_from_dir(out)
    if partial:
        tables, missing = finished_tables(GridPlan(study, out, Settings()))
        if not tables:
            raise ProbeError(f"{out} has no finished cell yet; there is nothing to report.")
        return write_report(out, study, tables, manifest, tuple(c.label for c in missing))
    if manifest.get("n_done") != manifest.get("n_cells"):
        raise ProbeError(
            f"{out} is unfinished ({manifest.get('n_done')} of {manifest.get('n_cells')} cells); "
            "run the study again to finish it (finished cells are kept), or pass --partial for "
            "a report on the finished cells."
        )
    return write_report(out, study, load_tables(out), manifest)
