"""Summary tables of a study's results: seen vs unseen lengths, ranks across tasks, attention
entropy by length, pruning curves. Each returns a
tidy DataFrame; means and 95% intervals are over seeds (`stats.over_seeds`)."""

from __future__ import annotations

import pandas as pd

from probe.study.verdicts.stats import over_seeds

CELL = ["arm", "task", "seed", "L_min", "L"]


def arm_sorted(df: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Rows in the study's arm order (stable within an arm)."""
    rank = {a: i for i, a in enumerate(order)}
    return df.sort_values("arm", key=lambda s: s.map(rank), kind="stable")


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


FIT = 0.95  # in-distribution exact match (mean over seeds) that counts as fitting a task
FIT_TOLERANCE = 1e-9  # so a mean of 0.95 computed as 0.94999999999 still fits


def fitted(seen_summary: pd.DataFrame) -> pd.Series:
    """Per row of a `by_arm_task` summary at the training lengths: does the arm fit the task?"""
    return seen_summary["mean"] >= FIT - FIT_TOLERANCE


def reciprocal_ranks(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """task -> arm -> score in; arm -> mean over the tasks of 1 / rank (1 = best, ties share the
    best rank, an arm missing from a task earns 0 there)."""
    total: dict[str, float] = {}
    for by_arm in scores.values():
        for arm, value in by_arm.items():
            rank = 1 + sum(other > value for other in by_arm.values())
            total[arm] = total.get(arm, 0.0) + 1.0 / rank
    return {arm: value / len(scores) for arm, value in total.items()} if scores else {}


def fitted_ranks(unseen_summary: pd.DataFrame, seen_summary: pd.DataFrame) -> pd.DataFrame:
    """Rank per task of each arm that fits that task (by mean at unseen lengths; arms that do
    not fit get no rank) and the mean reciprocal rank over the tasks some arm fits. Columns:
    arm, mrr, then 'rank TASK' per such task; sorted best first."""
    fit = seen_summary.assign(fit=fitted(seen_summary)).set_index(["arm", "task"])["fit"]
    scores: dict[str, dict[str, float]] = {}
    for row in unseen_summary.itertuples():
        if fit.get((row.arm, row.task), False):
            scores.setdefault(row.task, {})[row.arm] = float(row.mean)
    scores = dict(sorted(scores.items()))
    arms = sorted(unseen_summary["arm"].unique())
    mrr = reciprocal_ranks(scores)
    table = pd.DataFrame({"arm": arms, "mrr": [mrr.get(a, 0.0) for a in arms]})
    for task, by_arm in scores.items():
        ranks = {a: 1 + sum(o > v for o in by_arm.values()) for a, v in by_arm.items()}
        table[f"rank {task}"] = pd.array([ranks.get(a) for a in arms], dtype="Int64")
    return table.sort_values(["mrr", "arm"], ascending=[False, True]).reset_index(drop=True)


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


def attention_over_training(train: pd.DataFrame) -> pd.DataFrame:
    """Per-head attention statistics logged during training (`stats_every`), averaged over the
    layers and heads of each cell: columns of CELL, step, metric, value."""
    rows = train[train["split"] == "attention"]
    if rows.empty:
        return rows
    return rows.groupby([*CELL, "step", "metric"], as_index=False)["value"].mean()
