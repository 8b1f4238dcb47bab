"""The role steps: previous-token, induction and sink scores of every head (roles), and Wu et
al. 2024's retrieval score on needle prompts (retrieval, causal language models); the report's
section on what the heads do presents both; the [roles] section of the study file, and the
claims of Wu et al. 2024 (retrieval heads) and Xiao et al. 2023 (attention sinks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from probe.errors import ProbeError
from probe.options import option
from probe.schema import ROLE_COLUMNS
from probe.study.heads import claims
from probe.study.heads import evidence as ev
from probe.study.heads.step import Claim, Options, Section, StepKind, StudySection
from probe.study.heads.study import HeadStudy

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject

# which retrieval score the retrieval and knock-out steps compute: in their options, so a change
# of definition recomputes exactly the steps that use it
RETRIEVAL_SCORE = "wu2024-greedy"


@dataclass(frozen=True)
class RoleOptions:
    enabled: bool = False
    # repeated random sequences for induction
    period: int = option(16, low=2, help="tokens repeated for induction")
    # needle-in-a-haystack prompts for retrieval heads (causal LMs; 0: none)
    needles: int = option(0, low=0, help="needle prompts; 0 turns retrieval off")
    context: int = option(256, low=64, help="tokens per needle prompt")


def _fit(subject: Subject) -> None:
    """Inputs within the model's positions; needle prompts only for a causal language model
    and buildable from the text."""
    from probe.study.heads.checks import within

    study = subject.study
    where, roles = study.where, study.roles
    within(subject, "roles", "period", roles.period, 2 * roles.period + 1 if roles.enabled else 0)
    within(subject, "roles", "context", roles.context, roles.context if roles.needles else 0)
    if not roles.needles:
        return
    off = "[roles] needles = 0 turns the needle prompts (and the knock-out) off"
    if subject.objective != "causal-lm":
        raise ProbeError(
            f"{where} [roles] needles: retrieval heads are measured on a causal language "
            f"model, and this one is scored by {subject.objective}; {off}."
        )
    try:
        subject.needles(1, seed=0)
    except ProbeError as exc:
        raise ProbeError(
            f"{where} [roles] needles = {roles.needles}, context = {roles.context}: "
            f"{str(exc).rstrip('.')}; {off}."
        ) from None


ROLES = StudySection("roles", 30, RoleOptions, fit=_fit)


def roles(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    from probe.analysis.roles import head_roles

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
    from probe.report.attention_plots import role_heatmaps

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


DECLARES = (
    StepKind("roles", 4, roles, _plan_roles, section=ROLES,
             reports=(Section("roles", 60, what_heads_do),),
             claims=(Claim("xiao2023", 50, claims.xiao, ("xiao2023",)),)),
    StepKind("retrieval", 5, retrieval, _plan_retrieval, section=ROLES,
             claims=(Claim("wu2024", 40, claims.wu, ("wu2024",)),)),
)  # fmt: skip
