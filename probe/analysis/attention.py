"""Per-head attention statistics of a model on its task, at several lengths, and their summary.

result = inspect_model(model, task, [8, 16, 32])
result.stats   # length, layer, site, head, statistic, value, min, max, n
result.roles   # layer, site, head, role, score, offset
head_summary(result.stats, result.roles)  # one row per head
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from probe.analysis.roles import head_roles
from probe.data.tasks import Batch, TaskConfig
from probe.errors import ProbeError
from probe.measure.batching import micro_batches
from probe.measure.evaluate import check_lengths, eval_batches, form_for
from probe.measure.observe import attention_stats
from probe.model import Transformer

SUMMARY_COLUMNS = [
    "layer",
    "site",
    "head",
    "normalized_entropy",
    "entropy_slope",
    "max_logit",
    "p_max",
    "sink_mass",
    "role",
    "role_score",
    "role_offset",
]


@dataclass
class Inspection:
    stats: pd.DataFrame  # per (length, layer, head, statistic)
    roles: pd.DataFrame  # per (layer, head, role)
    lengths: list[int]
    period: int  # length of the repeated random sequences behind the induction scores


def induction_period(model: Transformer, lengths: list[int]) -> int:
    """Repeated-sequence period for the induction score: the longest inspected length, capped
    so that [BOS] + 2 x period tokens fit a learned positional table."""
    limit = model.cfg.max_positions
    cap = (limit - 1) // 2 if limit is not None else 512
    return max(2, min(max(lengths), cap))


def inspect_model(
    model: Transformer,
    task: TaskConfig,
    lengths: Iterable[int],
    *,
    batch_size: int = 32,
    n_batches: int = 2,
    seed: int = 0,
    statistics: Iterable[str] | None = None,
    streaming: bool | str = "auto",
    period: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    max_batch_tokens: int | None = None,
) -> Inspection:
    """Attention statistics and head roles of `model` on `task` data at each length.

    `progress(stage, done, total)` is called as batches go (stage "statistics", then "roles").
    Every pass holds at most `max_batch_tokens` tokens (`inspect_batches`)."""
    lengths = sorted(set(int(n) for n in lengths))
    if not lengths:
        raise ProbeError("Give at least one task length to inspect, e.g. --lengths 8,16,32.")
    if batch_size < 1 or n_batches < 1:
        raise ProbeError("batch_size and n_batches must be at least 1.")
    check_lengths(model, task, lengths)
    if model.cfg.vocab_size < task.vocab_size:
        raise ProbeError(
            f"the model's vocabulary ({model.cfg.vocab_size}) is smaller than task "
            f"'{task.name}' needs ({task.vocab_size}); inspect it on the task it was trained on."
        )
    batches = eval_batches(task, form_for(model.cfg.arch), lengths, batch_size, n_batches, seed)
    return inspect_batches(model, batches, lengths, statistics=statistics, streaming=streaming,
                           period=period, seed=seed, progress=progress,
                           max_batch_tokens=max_batch_tokens)  # fmt: skip


def inspect_batches(
    model: Transformer,
    batches: Sequence[Batch],
    lengths: list[int],
    *,
    statistics: Iterable[str] | None = None,
    streaming: bool | str = "auto",
    period: int | None = None,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
    max_batch_tokens: int | None = None,
) -> Inspection:
    """Attention statistics and head roles of `model` on given batches (each batch's `length`
    labels its rows: a task length, or the tokens per row of text), run in micro-batches of at
    most `max_batch_tokens` tokens: both are sums over query rows, so the split changes
    nothing but memory (None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`)."""

    def report(stage: str):
        if progress is None:
            return None
        return lambda done, total: progress(stage, done, total)

    parts = list(micro_batches(batches, max_batch_tokens))
    stats = attention_stats(model, parts, statistics, streaming, progress=report("statistics"))
    period = period or induction_period(model, lengths)
    roles = head_roles(model, parts, period=period, seed=seed, max_batch_tokens=max_batch_tokens)
    if progress is not None:
        progress("roles", 1, 1)
    return Inspection(stats, roles, lengths, period)


def _slope(group: pd.DataFrame) -> float:
    """Least-squares slope of entropy against log(length) (NaN with fewer than 2 lengths)."""
    if group.length.nunique() < 2:
        return float("nan")
    return float(
        np.polyfit(np.log(group.length.to_numpy(float)), group.value.to_numpy(float), 1)[0]
    )


def head_summary(stats: pd.DataFrame, roles: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per head: normalized entropy and p_max and sink mass averaged over lengths, the
    largest max logit at any length, the slope of entropy against log(length) (about 1 for a
    head that spreads evenly over everything it sees, about 0 for one that keeps its focus), and
    the head's strongest role."""
    keys = ["layer", "site", "head"]
    wide = stats.pivot_table(index=keys, columns="statistic", values="value", aggfunc="mean")
    out = pd.DataFrame(index=wide.index)
    for name in ("normalized_entropy", "p_max", "sink_mass"):
        out[name] = wide.get(name, np.nan)
    top = stats[stats.statistic == "max_logit"].groupby(keys).value.max()
    out["max_logit"] = top.reindex(out.index)
    entropy = stats[stats.statistic == "entropy"]
    slopes = entropy.groupby(keys).apply(_slope, include_groups=False) if len(entropy) else None
    out["entropy_slope"] = slopes.reindex(out.index) if slopes is not None else np.nan
    out["role"], out["role_score"], out["role_offset"] = None, np.nan, np.nan
    if roles is not None and not roles.empty:
        best = roles.dropna(subset=["value"]).sort_values("value").groupby(keys).tail(1)
        best = best.set_index(keys)
        out["role"] = best.statistic.reindex(out.index)
        out["role_score"] = best.value.reindex(out.index)
        out["role_offset"] = best.offset.where(best.statistic == "positional").reindex(out.index)
    return out.reset_index()[SUMMARY_COLUMNS]
