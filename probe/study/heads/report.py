"""A head study's report: results/NAME/report.md with its tables and figures beside it.

It opens with the question and an answer carrying its numbers (the sentences of its step kinds,
the pruning sentence of answer.py first), then the sections of its step kinds in their order
(each declared beside its step in `heads/steps/`: the set-up, the pruning curves and operating
points, the speed of the pruned models, the agreement between importance estimators, head roles
and the retrieval knock-out), the comparison with the published direction of each claim the step
kinds declare (claims.py, kv_claims.py, heal_report.py), the verdicts and expectations, and how
to reproduce it. Rebuilt from the results directory alone (`probe study report DIR`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from probe.errors import ProbeError
from probe.references import published
from probe.report.report import MarkdownReport
from probe.study.documents import read_json
from probe.study.engine.workdir import MANIFEST
from probe.study.heads.findings import Findings
from probe.study.heads.plan import read_head_tables
from probe.study.heads.reproduction import head_reproduction
from probe.study.heads.steps import claims, report_sections, step_kinds
from probe.study.verdicts.checks import head_verdicts
from probe.study.verdicts.expect import Outcome
from probe.study.verdicts.reproduce import reference_for
from probe.words import counted


def read_findings(out: Path | str) -> Findings:
    """The study description, manifest and tables of the results directory `out`."""
    out = Path(out)
    try:
        study = read_json(out / "study.json")
        manifest = read_json(out / MANIFEST)
    except ProbeError as exc:
        raise ProbeError(f"'{out}' is not a finished head study run: {exc}") from None
    tables = read_head_tables(out)
    if "model" not in tables:
        raise ProbeError(f"'{out}' has no model table; run the study again to finish it.")
    return Findings(out, study, manifest, tables)


def answer(r: Findings) -> str:
    """The sentences of the step kinds that measured something (the pruning sentence, the key/value
    plans', the healing's), in their order."""
    parts = [p for k in step_kinds() if k.answer is not None and (p := k.answer(r))]
    return " ".join(parts) if parts else "No pruning curves were run."


def published_comparison(r: Findings, rep: MarkdownReport) -> None:
    """The section comparing the study with the published direction of each claim, and the
    references it cites."""
    items: list[str] = []
    cites: list[str] = []
    for claim in claims():
        said = claim.write(r)
        items += [i for i in (said if isinstance(said, list) else [said]) if i]
        cites += [key for key in claim.cites if key not in cites]
    if not items:
        return
    rep.heading("Against published work")
    rep.bullets(items)
    refs = [published(key) for key in cites]
    rep.heading("References", 3)
    rep.bullets([f"{ref.cite}." for ref in refs if any(ref.short in i for i in items)])


def reproduce_section(r: Findings, rep: MarkdownReport) -> None:
    m = r.manifest
    rep.heading("Reproduce")
    rep.bullets([
        f"`probe study run {m['file']}{' --smoke' if m.get('smoke') else ''}` (finished "
        "steps are reused from `steps/`; each step's `done.json` records its options, "
        "seconds and git commit); "
        f"`probe study report {r.out}` rebuilds this page.",
        f"git commit {m.get('git_commit')}, torch {m.get('versions', {}).get('torch')}, "
        f"{m.get('device')}, packages {m.get('packages')}; "
        f"{counted(len(m['steps']), 'step')}, this "
        f"run {m['wall_s']:.0f} s.",
    ])  # fmt: skip


def write_head_report(
    out: Path | str, comparison: Callable[[Findings, MarkdownReport], None] | None = None
) -> tuple[Path, list[Outcome]]:
    """Write report.md (and its tables and figures) into the results directory `out`; returns
    its path and the expectations' outcomes. `comparison`: the section set against published
    work (`published_comparison` unless given)."""
    r = read_findings(out)
    s = r.study
    rep = MarkdownReport(r.out, s["title"] or s["name"])
    if s["smoke"]:
        rep.paragraph("**Smoke version** (scaled down for CI): the numbers below are not results.")
    rep.paragraph(f"**Question.** {s['question']}")
    answer_at = len(rep.blocks)
    rep.paragraph(f"**Answer.** {answer(r)}")
    if s["description"]:
        rep.paragraph(s["description"])
    for section in report_sections():
        section.write(r, rep)
    (comparison or published_comparison)(r, rep)
    where = str(r.manifest.get("file", s["name"]))
    outcomes = head_verdicts(rep, s, r.tables, where, answer_at)
    reproduce_section(r, rep)
    ref = reference_for(r.out, s["name"], bool(s["smoke"]))
    if ref is not None:
        rep.paragraph("**Reproduction.** " + head_reproduction(r.tables, r.manifest, ref))
    return rep.write(), outcomes
