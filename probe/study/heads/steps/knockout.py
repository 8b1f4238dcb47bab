"""The knock-out step: copy accuracy and needle recall with the top-k retrieval heads masked,
against k random heads; the report's subsection on removing the retrieval heads and the
[knockout] section of the study file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from probe.errors import ProbeError
from probe.options import option
from probe.study.heads import evidence as ev
from probe.study.heads.step import Options, Section, StepKind, StudySection
from probe.study.heads.steps.roles import RETRIEVAL_SCORE
from probe.study.heads.study import HeadStudy
from probe.words import counted

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject


@dataclass(frozen=True)
class KnockoutOptions:
    # remove the top-k retrieval heads, for each k
    heads: tuple[int, ...] = option((), low=1, help="retrieval heads masked")
    # against k random heads, this many draws
    draws: int = option(10, low=1, help="random draws per k")
    # fresh needle prompts (not the ones the scores came from)
    prompts: int = option(20, low=1, help="fresh needle prompts")


def _check(study: HeadStudy) -> None:
    if study.knockout.heads and not study.roles.needles:
        raise ProbeError(
            f"{study.where} [knockout] heads needs retrieval scores: set [roles] needles to 1 or "
            "more (or knockout heads = [] to skip the knock-out)."
        )


def _fit(subject: Subject) -> None:
    """Knock-outs of fewer than half the heads, so the random ones can be drawn from the rest."""
    from probe.pruning.heads import present_heads

    n_heads = sum(len(h) for h in present_heads(subject.model))
    for k in subject.study.knockout.heads:
        if 2 * k > n_heads:
            raise ProbeError(
                f"{subject.study.where} [knockout] heads: {k} would leave fewer than {k} of the "
                f"model's {counted(n_heads, 'head')} to draw the random ones from; use at most "
                f"{n_heads // 2}."
            )


KNOCKOUT = StudySection("knockout", 40, KnockoutOptions, check=_check, fit=_fit)


def knockout(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """Copy accuracy on fresh needle prompts with the top-k retrieval heads (by Wu et al.'s score)
    masked, against k random heads from the rest (`draws` draws), for each k: columns k,
    selection, draw, copy_accuracy (teacher-forced share of needle tokens predicted right),
    recall (the greedy output's needle recall, Wu et al.'s measure of retrieval), heads."""
    import torch

    from probe.analysis.retrieval import retrieval_scores
    from probe.pruning.heads import masked

    ko = subject.study.knockout
    model = subject.model
    scores = subject.retrieval.sort_values(
        ["value", "layer", "head"], ascending=[False, True, True], kind="stable"
    )
    ranked = list(zip(scores.layer.astype(int), scores["head"].astype(int), strict=True))
    prompts = subject.needles(ko.prompts, seed=1)
    runs = [(0, "none", 0, [])]
    for k in ko.heads:
        top = ranked[:k]
        runs.append((k, "retrieval", 0, top))
        rest = ranked[k:]
        for draw in range(ko.draws):
            gen = torch.Generator().manual_seed(draw)
            pick = torch.randperm(len(rest), generator=gen)[:k].tolist()
            runs.append((k, "random", draw, [rest[i] for i in sorted(pick)]))
    rows = []
    for i, (k, selection, draw, heads) in enumerate(runs):
        with masked(model, heads):  # only these heads; the gates come back afterwards
            table = retrieval_scores(model, prompts)
        rows.append({"k": k, "selection": selection, "draw": draw,
                     "copy_accuracy": float(table["copy_accuracy"].iloc[0]),
                     "recall": float(table["recall"].iloc[0]),
                     "heads": " ".join(f"L{a}H{b}" for a, b in heads)})  # fmt: skip
        progress(i + 1, len(runs))
    return pd.DataFrame(rows)


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    ko, roles = study.knockout, study.roles
    if not ko.heads:
        return []
    options = {"needles": roles.needles, "context": roles.context, "heads": list(ko.heads),
               "draws": ko.draws, "prompts": ko.prompts, "score": RETRIEVAL_SCORE}  # fmt: skip
    return [("knockout", options)]


def removing_retrieval_heads(r: Findings, rep: MarkdownReport) -> None:
    """A subsection of the roles section (Wu et al.'s knock-out)."""
    if r.tables.get("roles") is None and r.tables.get("retrieval") is None:
        return  # no roles section to belong to
    knockout_table = r.tables.get("knockout")
    if knockout_table is None or not len(knockout_table):
        return
    from probe.report.pruning_plots import knockout_plot

    rep.heading("Removing the retrieval heads", 3)
    rep.paragraph("Fresh needle prompts (not those the scores came from) with the top-k "
                  "retrieval heads masked, against k heads drawn at random from the "
                  "rest; p = (1 + draws at or below) / (1 + draws). Needle recall of "
                  "the greedy output is Wu et al. 2024's measure of retrieval (the "
                  "verdict below uses it); copy accuracy is the teacher-forced share of "
                  "needle tokens predicted right.")  # fmt: skip
    measures = [("recall", "knockout.csv", "knockout.png", "Needle recall of the "
                 "greedy output")] if "recall" in knockout_table.columns else []  # fmt: skip
    copy_name = "knockout_copy_accuracy" if measures else "knockout"
    measures.append(("copy_accuracy", f"{copy_name}.csv", f"{copy_name}.png",
                     "Teacher-forced copy accuracy"))  # fmt: skip
    for metric, table, figure, title in measures:
        rep.paragraph(f"**{title}.**")
        rep.table(ev.knockout_test(knockout_table, metric), table, digits=3)
        rep.figure(knockout_plot(knockout_table, metric), figure,
                   f"{title} with retrieval heads or random heads masked")  # fmt: skip


DECLARES = StepKind("knockout", 6, knockout, _plan, section=KNOCKOUT,
                    reports=(Section("knockout", 70, removing_retrieval_heads),))  # fmt: skip
