"""Summary tables of a study's results: seen vs unseen lengths, ranks across tasks, attention
entropy by length, pruning curves, and the comparison with published numbers. Each returns a
tidy DataFrame; means and 95% intervals are over seeds (`stats.over_seeds`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from probe.study.spec import Reference
from probe.study.stats import over_seeds

CELL = ["arm", "task", "seed", "L_min", "L"]


def seen(df: pd.DataFrame) -> pd.Series:
    """Rows at a training length (L_min <= length <= L)."""
    return (df["length"] >= df["L_min"]) & (df["length"] <= df["L"])


def unseen(df: pd.DataFrame) -> pd.Series:
    """Rows longer than any training example (length > L)."""
    return df["length"] > df["L"]


def metric_rows(eval_table: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = eval_table[eval_table["metric"] == metric]
    return rows[[*CELL, "variant", "length", "value"]].reset_index(drop=True)


def by_arm_task(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean over the rows' lengths per seed, then mean and CI over seeds, per arm and task."""
    return over_seeds(rows, ["arm", "task"])


def mean_reciprocal_rank(summary: pd.DataFrame, value: str = "mean") -> pd.DataFrame:
    """Per task, rank arms by `value` (1 = best, ties share the best rank); columns arm, mrr,
    then one rank column per task."""
    ranks = summary.assign(
        rank=summary.groupby("task")[value].rank(ascending=False, method="min")
    )  # fmt: skip
    wide = ranks.pivot_table(index="arm", columns="task", values="rank", aggfunc="first")
    mrr = (1.0 / wide).mean(axis=1)
    wide = wide.astype("Int64")  # method="min" ranks are whole numbers
    out = wide.add_prefix("rank ").assign(mrr=mrr).reset_index()
    out = out[["arm", "mrr", *[c for c in out.columns if c.startswith("rank ")]]]
    return out.sort_values(["mrr", "arm"], ascending=[False, True]).reset_index(drop=True)


def fitted_tasks(seen_summary: pd.DataFrame, threshold: float) -> list[str]:
    """Tasks on which at least one arm reaches `threshold` at the training lengths: the only
    ones where a rank at unseen lengths says something (where no arm fits, all score about 0
    and their order is noise)."""
    best = seen_summary.groupby("task")["mean"].max()
    return sorted(best[best >= threshold].index)


def entropy_by_length(attention: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """`statistic` averaged over layers and heads per cell and length."""
    rows = attention[attention["statistic"] == statistic]
    return rows.groupby([*CELL, "variant", "length"], as_index=False)["value"].mean()


def pruning_rows(pruning: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per cell, method and fraction of heads removed: `metric` averaged over importance
    splits."""
    rows = pruning[pruning["metric"] == metric]
    return rows.groupby([*CELL, "method", "fraction"], as_index=False)["value"].mean()


def training_loss(train: pd.DataFrame, smooth: int = 1) -> pd.DataFrame:
    """The logged training loss per cell and step; with `smooth` > 1, a centred moving average
    over that many logged steps (each step's batch has one random length, so the raw loss jumps)."""
    rows = train[(train["split"] == "train") & (train["metric"] == "loss")]
    rows = rows[[*CELL, "step", "value"]].sort_values([*CELL, "step"]).reset_index(drop=True)
    if smooth > 1:
        rolling = rows.groupby(CELL)["value"].rolling(smooth, center=True, min_periods=1).mean()
        rows["value"] = rolling.reset_index(level=list(range(len(CELL))), drop=True)
    return rows


def final_loss(train: pd.DataFrame) -> pd.DataFrame:
    """The last logged training loss per cell, mean and CI over seeds per arm and task."""
    loss = training_loss(train)
    last = loss[loss["step"] == loss.groupby(CELL)["step"].transform("max")]
    return over_seeds(last, ["arm", "task"])


# ------------------------------------------------------------------ published comparison


def _verdict(rho: float, n_pairs: int) -> str:
    if n_pairs == 0 or np.isnan(rho):
        return "undecided (every encoding scores the same here)"
    if rho >= 0.5:
        return "agrees"
    if rho > 0:
        return "partly agrees"
    return "disagrees"


def _pairs(ours: pd.Series, theirs: pd.Series) -> tuple[int, int, int]:
    """(pairs ordered the same way, pairs ordered, pairs tied in ours) over arms both rank."""
    same = ordered = tied = 0
    arms = list(ours.index)
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            d_theirs = np.sign(theirs[a] - theirs[b])
            d_ours = np.sign(ours[a] - ours[b])
            if d_theirs == 0:
                continue
            if d_ours == 0:
                tied += 1
                continue
            ordered += 1
            same += int(d_ours == d_theirs)
    return same, ordered, tied


def compare(summary: pd.DataFrame, reference: Reference) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows: task, arm, ours mean/low/high, published; per task: Spearman rho over the arms
    both have, pairwise agreement and a verdict). `summary` is `by_arm_task` over the lengths
    the reference reports (unseen lengths)."""
    rows, verdicts = [], []
    for task, values in reference.values.items():
        ours = summary[summary["task"] == task].set_index("arm")
        arms = [a for a in values if a in ours.index]
        for arm in arms:
            o = ours.loc[arm]
            rows.append({"task": task, "arm": arm, "published_as": reference.names.get(arm, arm),
                         "mean": o["mean"], "low": o["low"], "high": o["high"],
                         "published": float(values[arm])})  # fmt: skip
        if len(arms) < 2:
            continue
        mine = ours.loc[arms, "mean"].astype(float)
        theirs = pd.Series({a: float(values[a]) for a in arms})
        rho = float(spearmanr(mine, theirs).statistic) if mine.nunique() > 1 else float("nan")
        same, ordered, tied = _pairs(mine, theirs)
        verdicts.append({
            "task": task, "n_arms": len(arms), "spearman": rho, "pairs_agree": same,
            "pairs_ordered": ordered, "pairs_tied_in_ours": tied,
            "best_ours": mine.idxmax() if mine.nunique() > 1 else "tie",
            "best_published": theirs.idxmax(), "verdict": _verdict(rho, ordered),
        })  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(verdicts)


def compare_mrr(mrr: pd.DataFrame, reference: Reference) -> tuple[pd.DataFrame, str]:
    """Our mean reciprocal rank beside the published one, and a one-line verdict."""
    if not reference.mrr:
        return pd.DataFrame(), ""
    ours = mrr.set_index("arm")["mrr"]
    arms = [a for a in reference.mrr if a in ours.index]
    table = pd.DataFrame({
        "arm": arms, "published_as": [reference.names.get(a, a) for a in arms],
        "mrr": [float(ours[a]) for a in arms],
        "published_mrr": [float(reference.mrr[a]) for a in arms],
    })  # fmt: skip
    if len(arms) < 2 or table["mrr"].nunique() < 2:
        return table, "undecided (our ranks do not separate these encodings)"
    rho = float(spearmanr(table["mrr"], table["published_mrr"]).statistic)
    return table, f"{_verdict(rho, 1)} (Spearman rho {rho:.2f} over {len(arms)} encodings)"
