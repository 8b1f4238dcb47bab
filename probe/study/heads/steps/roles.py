"""The role steps: previous-token, induction and sink scores of every head (roles), and Wu et
al. 2024's retrieval score on needle prompts (retrieval, causal language models); the report's
section on what the heads do presents both."""

from __future__ import annotations

import pandas as pd

from probe.analysis.roles import head_roles
from probe.report.attention_plots import role_heatmaps
from probe.report.report import MarkdownReport
from probe.schema import ROLE_COLUMNS
from probe.study.heads import evidence as ev
from probe.study.heads.findings import Findings
from probe.study.heads.step import Options, Section, StepKind
from probe.study.heads.study import HeadStudy
from probe.study.heads.subject import Subject

# which retrieval score the retrieval and knock-out steps compute: in their options, so a change
# of definition recomputes exactly the steps that use it
RETRIEVAL_SCORE = "wu2024-greedy"


def roles(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    return head_roles(subject.model, subject.splits[1], period=options["period"], seed=0)


def retrieval(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    return subject.retrieval


def _plan_roles(study: HeadStudy) -> list[tuple[str, Options]]:
    return [("roles", {"period": study.roles.period})] if study.roles.enabled else []


def _plan_retrieval(study: HeadStudy) -> list[tuple[str, Options]]:
    r = study.roles
    if not r.needles:
        return []
    return [("retrieval", {"needles": r.needles, "context": r.context,
                           "score": RETRIEVAL_SCORE})]  # fmt: skip


def what_heads_do(r: Findings, rep: MarkdownReport) -> None:
    roles_table = r.tables.get("roles")
    retrieval_table = r.tables.get("retrieval")
    if roles_table is None and retrieval_table is None:
        return
    rep.heading("What the heads do")
    parts = [t for t in (roles_table, retrieval_table) if t is not None]
    both = pd.concat([p[ROLE_COLUMNS] for p in parts])
    counts = ev.role_counts(both, r.n_heads)
    rep.paragraph(
        "A head counts for a role when its score reaches the threshold (retrieval: exceeds "
        "it, as Wu et al. 2024 count): previous-token and "
        "sink are mean attention on the previous and on the first token; induction is the "
        "mean attention to the token after the current token's earlier occurrence on "
        "repeated random sequences; retrieval is Wu et al. 2024's score and threshold: with "
        "the model decoding greedily after the question, the share of the needle's tokens "
        "the model generates while the head's most-attended key is that token in the "
        "needle, averaged over the prompts the model retrieves (more than half the needle "
        "recalled; the model decodes as many tokens as the needle has, where the authors' "
        "code decodes up to 50 or to a newline, so a needle token copied later is not "
        "counted)."
    )
    rep.table(counts, "role_counts.csv", digits=3)
    shown = both[both.statistic.isin(["previous_token", "induction", "sink", "retrieval"])]
    rep.figure(role_heatmaps(shown), "roles.png", "Role scores of every head")
    rep.data(
        both.rename(columns={"statistic": "role", "value": "score"}),
        "roles.csv",
        "Every head's score for every role.",
    )  # the reader's words: role, score
    if retrieval_table is not None and len(retrieval_table):
        rep.paragraph(ev.retrieval_note(retrieval_table, int(r.study["roles"]["needles"])))


KINDS = (StepKind("roles", 4, roles, _plan_roles),
         StepKind("retrieval", 5, retrieval, _plan_retrieval))  # fmt: skip
SECTIONS = (Section("roles", 60, what_heads_do),)
