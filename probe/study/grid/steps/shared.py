"""What the report sections of several steps (and the report's training section) share: the bar
for fitting the training lengths, the arm x task table of intervals, the note on seeds."""

from __future__ import annotations

import pandas as pd

from probe.study.verdicts import summary
from probe.study.verdicts.stats import row_ci

FIT = summary.FIT
FIT_AT = summary.FIT - summary.FIT_TOLERANCE  # what summary.fitted compares means with


def wide_table(
    table: pd.DataFrame,
    order: list[str],
    extra: dict[str, pd.Series] | None = None,
    threshold: float | None = None,
) -> pd.DataFrame:
    """arm x task grid of 'mean [low, high]' strings, arms in `order` (each mean on the same side
    of `threshold` as printed, when the means are tested against one)."""
    cells = table.assign(text=table.apply(row_ci, axis=1, threshold=threshold))
    grid = cells.pivot_table(index="arm", columns="task", values="text", aggfunc="first")
    grid = grid.reindex([a for a in order if a in grid.index])
    for name, column in (extra or {}).items():
        grid[name] = column.reindex(grid.index)
    return grid.reset_index()


def seed_note(table: pd.DataFrame) -> str:
    n = int(table["n_seeds"].min()) if len(table) else 0
    most = int(table["n_seeds"].max()) if len(table) else 0
    if most < 2:
        return "One seed per cell, so the numbers are single runs with no confidence interval."
    if n < 2:
        return (f"Each entry is the mean over 1 to {most} seeds, with a 95% bootstrap confidence "
                "interval (scipy.stats.bootstrap, percentile) where there are two or more; "
                "per-seed values are in the CSV.")  # fmt: skip
    return (f"Each entry is the mean over {n} seeds with a 95% bootstrap confidence interval "
            "(scipy.stats.bootstrap, percentile); per-seed values are in the CSV.")  # fmt: skip
