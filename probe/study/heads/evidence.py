"""The numbers a head study's report states, computed from its tables alone.

Each function takes the gathered tables and returns a small DataFrame or a dict; the report (the
sections in `steps/`, answer.py, claims.py) only words and draws them. Comparisons follow the
positions report's rules: an interval or a test, never a threshold on one point estimate; seeds
are disjoint text splits.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from probe.pruning.objectives import operating_points, primary
from probe.study.verdicts.stats import mann_whitney


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def share_range(lo: float, hi: float) -> str:
    """ "6%" when the seeds agree, else "30% to 40%"."""
    return pct(lo) if abs(hi - lo) < 1e-9 else f"{pct(lo)} to {pct(hi)}"


def operating_summary(curves: pd.DataFrame, objective: str, tolerance: float,
                      n_heads: int) -> pd.DataFrame:  # fmt: skip
    """Per method and unit: the operating point's share of heads in each seed, its minimum and
    maximum, and the metric there (mean over seeds)."""
    ops = operating_points(curves, objective, tolerance)
    rows = []
    for (method, unit), g in ops.groupby(["method", "unit"], sort=False):
        fractions = g.fraction.astype(float)
        rows.append({
            "method": method, "unit": unit, "seeds": len(g),
            "min_fraction": fractions.min(), "max_fraction": fractions.max(),
            "min_heads": round(fractions.min() * n_heads),
            "per_seed": " ".join(f"{f:.2f}" for f in fractions),
            "value": g.value.mean(), "reference": g.reference.mean(),
        })  # fmt: skip
    return pd.DataFrame(rows).sort_values(["min_fraction", "max_fraction"], ascending=False)


def area(curves: pd.DataFrame, metric: str, upto: float) -> pd.DataFrame:
    """Mean of `metric` over the fractions in (0, upto], per method, unit and seed: one number
    per seed that sums up the first part of a curve."""
    part = curves[(curves.metric == metric) & (curves.fraction > 0) & (curves.fraction <= upto)]
    return part.groupby(["method", "unit", "seed"], as_index=False)["value"].mean()


def against_random(curves: pd.DataFrame, objective: str, upto: float = 0.5) -> pd.DataFrame:
    """Each method's curve area against random rankings', seed by seed: the means, every seed
    of the method better than every random seed or not, and an exact one-sided Mann-Whitney U
    p-value (the method better than random)."""
    metric, higher = primary(objective)
    areas = area(curves, metric, upto)
    rows = []
    for unit, by_unit in areas.groupby("unit"):
        rand = by_unit[by_unit.method == "random"].value.to_numpy()
        for method, g in by_unit.groupby("method", sort=False):
            if method == "random" or len(rand) == 0:
                continue
            mine = g.value.to_numpy()
            side = "greater" if higher else "less"
            p = mann_whitney(mine, rand, side)
            rows.append({
                "method": method, "unit": unit, "metric": metric, "upto": upto,
                "mean": mine.mean(), "random_mean": rand.mean(), "n": len(mine),
                "n_random": len(rand), "p_value": float(p),
            })  # fmt: skip
    return pd.DataFrame(rows)


def seed_stability(importance: pd.DataFrame) -> pd.DataFrame:
    """Per method: Spearman rho between the rankings of every pair of seeds (disjoint text)."""
    rows = []
    for method, g in importance.groupby("method", sort=False):
        wide = g.pivot_table(index=["layer", "head"], columns="seed", values="value")
        seeds = list(wide.columns)
        rhos = [stats.spearmanr(wide[a], wide[b]).statistic
                for i, a in enumerate(seeds) for b in seeds[i + 1:]]  # fmt: skip
        rhos = [r for r in rhos if not math.isnan(r)]
        rows.append({"method": method, "pairs": len(rhos),
                     "min_rho": min(rhos) if rhos else np.nan,
                     "mean_rho": float(np.mean(rhos)) if rhos else np.nan})  # fmt: skip
    return pd.DataFrame(rows)


def tuning_recovery(curves: pd.DataFrame) -> pd.DataFrame:
    """Mask tuning against the same Fisher mask untuned, per seed and fraction: the loss
    increase of each over the unpruned model and the share of it tuning recovers."""
    loss = curves[(curves.metric == "loss") & (curves.unit == "head")
                  & curves.method.isin(["fisher", "fisher+tune"])]  # fmt: skip
    wide = loss.pivot_table(index=["seed", "fraction"], columns="method", values="value")
    if not {"fisher", "fisher+tune"} <= set(wide.columns):
        return pd.DataFrame()
    base = loss[loss.n_pruned == 0].groupby("seed").value.first()
    wide = wide.reset_index()
    wide["reference"] = wide.seed.map(base)
    wide = wide[wide.fraction > 0]
    untuned = wide["fisher"] - wide["reference"]
    tuned = wide["fisher+tune"] - wide["reference"]
    out = pd.DataFrame({"seed": wide.seed, "fraction": wide.fraction,
                        "increase_untuned": untuned, "increase_tuned": tuned,
                        "recovered": (untuned - tuned) / untuned.where(untuned > 0)})  # fmt: skip
    return out.reset_index(drop=True)


def retrieval_note(retrieval: pd.DataFrame, needles: int) -> str:
    """What the retrieval scores rest on: how many prompts the model retrieved decoding greedily,
    its needle recall, and its teacher-forced copy accuracy."""
    first = retrieval.iloc[0]
    acc = float(first.copy_accuracy)
    if "prompts" not in retrieval.columns:  # a table from before Wu et al.'s definition
        return (
            f"The unpruned model copies {pct(acc)} of the needle tokens teacher-forced; "
            "these scores are the teacher-forced variant (hits over the steps copied), "
            "computed before the study used Wu et al.'s definition: rerun the study."
        )
    return (
        f"Decoding greedily, the unpruned model retrieves {int(first.prompts)} of {needles} "
        f"needles (more than half of the needle's tokens in its output; mean recall "
        f"{pct(float(first.recall))}), and the scores average over those prompts. "
        f"Teacher-forced it predicts {pct(acc)} of the needle tokens right; the "
        "teacher-forced variant of the score (hits over the steps it copied, in "
        "retrieval.csv as score_teacher_forced) is larger by about 1 / that share."
    )


def role_counts(roles: pd.DataFrame, n_heads: int) -> pd.DataFrame:
    """Per role: how many heads pass its threshold (`probe.analysis.roles.has_role`), their share,
    and the layers they sit in."""
    from probe.analysis.roles import ROLE_THRESHOLDS, has_role

    rows = []
    for role, threshold in ROLE_THRESHOLDS.items():
        part = roles[roles.statistic == role]
        if part.empty:
            continue
        hits = part[has_role(role, part.value)].sort_values("value", ascending=False)
        top = hits.head(5)
        rows.append({
            "role": role, "threshold": threshold.value, "heads": len(hits),
            "share": len(hits) / n_heads,
            "layers": " ".join(str(x) for x in sorted(hits.layer.unique())),
            "strongest": ", ".join(f"L{r.layer}H{r.head} {r.value:.2f}"
                                   for r in top.itertuples()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def knockout_test(knockout: pd.DataFrame, metric: str = "copy_accuracy") -> pd.DataFrame:
    """Per k: `metric` (copy_accuracy, teacher-forced, or recall, the greedy output's needle
    recall) with the top-k retrieval heads masked, the random draws' range and an empirical
    one-sided p-value: (1 + draws at or below it) / (1 + draws)."""
    rows = []
    base = knockout[knockout.selection == "none"][metric]
    for k, g in knockout[knockout.k > 0].groupby("k"):
        top = float(g[g.selection == "retrieval"][metric].iloc[0])
        rand = g[g.selection == "random"][metric].to_numpy()
        rows.append({
            "k": int(k), "unmasked": float(base.iloc[0]) if len(base) else np.nan,
            "retrieval_heads": top, "random_min": rand.min(), "random_median": np.median(rand),
            "random_max": rand.max(), "draws": len(rand),
            "p_value": (1 + int((rand <= top).sum())) / (1 + len(rand)),
        })  # fmt: skip
    return pd.DataFrame(rows)


def speed(timing: pd.DataFrame) -> pd.DataFrame:
    """Tokens/s of each pruned model and of the original timed beside it, and their ratio."""
    if timing.empty:
        return pd.DataFrame()
    pivot = timing.pivot_table(index=["method", "unit", "n_pruned", "why", "batch_size"],
                               columns="variant", values="tokens_per_s").reset_index()  # fmt: skip
    params = timing[timing.variant == "pruned"].groupby(["method", "unit", "n_pruned"]).parameters
    pivot["parameters"] = [params.first().get((m, u, n)) for m, u, n in
                           zip(pivot.method, pivot.unit, pivot.n_pruned, strict=True)]  # fmt: skip
    pivot["speedup"] = pivot["pruned"] / pivot["original"]
    return pivot.rename(columns={"original": "original_tok_s", "pruned": "pruned_tok_s"})


def speed_signs(speed_table: pd.DataFrame) -> pd.DataFrame:
    """Per number of heads removed: how many side-by-side timings (methods x batch sizes) ran
    faster than the original, the range and median of their speed-ups, and a two-sided exact
    sign test of "no faster nor slower" (a paired test: each pruned copy was timed beside the
    original, so the machine's drift hits both)."""
    rows = []
    for n, g in speed_table.groupby("n_pruned"):
        ratios = g["speedup"].dropna()
        faster = int((ratios > 1).sum())
        p = stats.binomtest(faster, len(ratios), 0.5).pvalue if len(ratios) else math.nan
        rows.append({"n_pruned": int(n), "timings": len(ratios), "faster": faster,
                     "min": ratios.min(), "median": ratios.median(), "max": ratios.max(),
                     "p_sign": p})  # fmt: skip
    return pd.DataFrame(rows)


def least_important(importance: pd.DataFrame, method: str, n: int) -> list[str]:
    """The heads ("L2H11", ...) that `method` ranks among the n least important in every seed
    (n of them when the seeds agree)."""
    from probe.pruning.heads import ranking

    if "method" not in importance.columns:  # a study without [importance] methods
        return []
    part = importance[importance.method == method]
    if part.empty or n <= 0:
        return []
    sets = []
    for _, g in part.groupby("seed"):
        rank = ranking(g.drop(columns="seed")).sort_values(["score", "layer", "head"])
        sets.append({(int(r.layer), int(r.head)) for r in rank.head(n).itertuples()})
    common = set.intersection(*sets)
    return [f"L{a}H{b}" for a, b in sorted(common)]
