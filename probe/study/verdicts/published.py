"""The comparison of a study's ranking with a published one, decided from evidence.

The rules, in the order they apply:

1. Fitted arms only. On each task an arm is ranked only when it fits that task's training
   lengths (mean exact match over seeds >= summary.FIT, 0.95); the others are named and left
   out. "Fitted" is judged on the compared tasks alone.
2. Shared encodings only. Rankings are compared over the encodings both sides rank.
3. Enough arms. With fewer than MIN_ARMS shared fitted arms there is no verdict: "too few to
   compare".
4. A test, not a threshold on a point estimate. Kendall's S (concordant minus discordant pairs,
   ties count 0) is an integer; its exact permutation p-value (our values permuted over the arms,
   every permutation counted) is a fraction compared exactly with ALPHA, so no rounding can flip
   it. Seed noise is accounted for by a bootstrap over seeds (seeds resampled within each arm, the
   ranking recomputed): the verdict "agrees" needs p <= ALPHA for agreement AND S > 0 in at least
   97.5% of the resamples (the 2.5th percentile of S, an integer, above 0); "disagrees" the same
   the other way; anything else is "inconclusive". Tasks no arm fits are left out of the ranking
   across tasks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from probe.significance import ALPHA_EXACT as ALPHA
from probe.study.verdicts.summary import fitted, reciprocal_ranks

MIN_ARMS = 4
N_BOOTSTRAP = 2000


def kendall_s(x: list[float], y: list[float]) -> int:
    """Kendall's S: pairs ordered the same way in x and y minus pairs ordered oppositely."""
    s = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        s += int(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]))
    return s


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """tau-b = S / sqrt((n0 - ties in x) (n0 - ties in y)); NaN when either side is all tied."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    tx = sum(1 for i, j in pairs if x[i] == x[j])
    ty = sum(1 for i, j in pairs if y[i] == y[j])
    denominator = math.sqrt((len(pairs) - tx) * (len(pairs) - ty))
    return kendall_s(x, y) / denominator if denominator else float("nan")


def permutation_p(x: list[float], y: list[float]) -> tuple[Fraction, Fraction]:
    """Exact one-sided p-values (agreement, disagreement): the fraction of all orderings of x
    over the arms whose S is >= (resp. <=) the observed S."""
    observed = kendall_s(x, y)
    values = [kendall_s(list(p), y) for p in itertools.permutations(x)]
    n = len(values)
    return (Fraction(sum(v >= observed for v in values), n),
            Fraction(sum(v <= observed for v in values), n))  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """One ranking compared with the published one."""

    scope: str  # a task, or "across tasks"
    arms: tuple[str, ...]  # shared fitted arms, best first by our score
    left_out: tuple[str, ...]  # published encodings we have but that did not fit here
    ours: tuple[float, ...]  # our score per arm (unseen exact match, or MRR across tasks)
    published_rank: tuple[float, ...]  # the paper's rank per arm (1 = best; ties share)
    s: int | None = None
    tau: float | None = None
    p_agree: Fraction | None = None
    p_disagree: Fraction | None = None
    s_low: int | None = None  # 2.5th and 97.5th percentiles of S over seed resamples
    s_high: int | None = None
    verdict: str = "too few to compare"

    @property
    def best(self) -> str | None:
        return self.arms[0] if self.arms else None


def decide(p_agree: Fraction, p_disagree: Fraction, s_low: int, s_high: int) -> str:
    if p_agree <= ALPHA and s_low > 0:
        return "agrees"
    if p_disagree <= ALPHA and s_high < 0:
        return "disagrees"
    return "inconclusive"


def _ranked(scores: dict[str, float], ranks: dict[str, float]) -> tuple[list[str], list, list]:
    arms = sorted(scores, key=lambda a: (-scores[a], a))
    return arms, [scores[a] for a in arms], [-ranks[a] for a in arms]  # higher is better


def compare_one(
    scope: str,
    scores: dict[str, float],
    published: dict[str, float],
    resampled: list[dict[str, float]],
    left_out: tuple[str, ...],
) -> Comparison:
    """`scores`: our score per shared fitted arm; `published`: the paper's rank per arm;
    `resampled`: our scores recomputed on seed resamples (for the interval of S)."""
    arms, ours, theirs = _ranked(scores, published)
    rank = tuple(published[a] for a in arms)
    if len(arms) < MIN_ARMS:
        return Comparison(scope, tuple(arms), left_out, tuple(ours), rank)
    p_agree, p_disagree = permutation_p(ours, theirs)
    boot = sorted(kendall_s([r[a] for a in arms], theirs) for r in resampled)
    last = len(boot) - 1  # percentile positions in integers: 2.5% rounded down, 97.5% up
    s_low, s_high = boot[last * 25 // 1000], boot[-(-last * 975 // 1000)]
    return Comparison(
        scope, tuple(arms), left_out, tuple(ours), rank, kendall_s(ours, theirs),
        kendall_tau_b(ours, theirs), p_agree, p_disagree, s_low, s_high,
        decide(p_agree, p_disagree, s_low, s_high),
    )  # fmt: skip


def seed_resamples(
    per_seed: pd.DataFrame, n: int = N_BOOTSTRAP, seed: int = 0
) -> list[dict[tuple[str, str], float]]:
    """n resamples of (arm, task) -> mean over that cell's seeds drawn with replacement.
    `per_seed` has columns arm, task, seed, value (one row per seed)."""
    rng = np.random.default_rng(seed)
    means = {}
    for key, group in per_seed.groupby(["arm", "task"]):
        values = group["value"].to_numpy(dtype=float)  # [seeds]
        draws = rng.integers(0, len(values), size=(n, len(values)))  # [n, seeds]
        means[key] = values[draws].mean(axis=1)  # [n]
    keys = list(means)
    return [{k: float(means[k][i]) for k in keys} for i in range(n)]


def compare_ranking(
    unseen_per_seed: pd.DataFrame, seen_summary: pd.DataFrame, published: dict[str, float]
) -> list[Comparison]:
    """One Comparison per task, then one across the tasks that some arm fits (mean reciprocal
    rank over them, among the arms that fit every one of them). `unseen_per_seed`: arm, task,
    seed, value (mean unseen exact match of the seed); `seen_summary`: `by_arm_task` at the
    training lengths (any arm, any task); `published`: arm -> the paper's rank."""
    tasks = sorted(unseen_per_seed["task"].unique())
    fit = seen_summary.assign(fit=fitted(seen_summary)).set_index(["arm", "task"])["fit"]
    means = unseen_per_seed.groupby(["arm", "task"])["value"].mean()
    resamples = seed_resamples(unseen_per_seed)
    have = sorted({a for a in published if a in set(unseen_per_seed["arm"])})
    out, everywhere = [], set(have)
    learned = [t for t in tasks if fit.xs(t, level="task").any()]  # some arm fits it
    for task in tasks:
        shared = [a for a in have if fit.get((a, task), False)]
        if task in learned:
            everywhere &= set(shared)
        left = tuple(a for a in have if a not in shared)
        scores = {a: float(means[(a, task)]) for a in shared}
        boot = [{a: r[(a, task)] for a in shared} for r in resamples]
        out.append(compare_one(task, scores, published, boot, left))
    arms = sorted(everywhere) if learned else []
    left = tuple(a for a in have if a not in arms)

    def mrr(table) -> dict[str, float]:
        return reciprocal_ranks({t: {a: float(table[(a, t)]) for a in arms} for t in learned})

    scores = mrr(means) if arms else {}
    boot = [mrr(r) for r in resamples] if arms else []
    out.append(compare_one("across tasks", scores, published, boot, left))
    return out
