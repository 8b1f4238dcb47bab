"""A head study's pruning sentence: the part of its answer carrying the numbers of how many heads
can go by the best estimator, against random rankings, how fast the pruned model runs, which
heads have roles and what masking the retrieval heads does. The curves' step kind declares it as
its answer (`steps/curves.py`); the report joins it with the other kinds' (`report.answer`)."""

from __future__ import annotations

import pandas as pd

from probe.study.heads import evidence as ev
from probe.study.heads.findings import Findings
from probe.words import counted


def _speed_at(r: Findings, method: str, unit: str, n: int) -> str:
    s = r.speed
    if s.empty:
        return ""
    part = s[(s.method == method) & (s.unit == unit) & (s.n_pruned == n)]
    if part.empty:
        return ""
    ratios = ", ".join(f"{x.speedup:.2f}x tokens/s at batch {x.batch_size}"
                       for x in part.itertuples())  # fmt: skip
    signs = r.signs.set_index("n_pruned").loc[n]
    return (f"{ratios} of the original (of all {counted(int(signs.timings), 'timing')} of "
            f"models with {counted(n, 'head')} removed, {int(signs.faster)} ran faster "
            "than the original "
            "beside them, "
            f"median {signs['median']:.2f}x, sign test p = {signs.p_sign:.2g})")  # fmt: skip


def pruning_answer(r: Findings) -> str | None:
    """The pruning sentence (None when the study ran no curves)."""
    best = r.best()
    if best is None:
        return None
    rand = r.ops[(r.ops.method == "random") & (r.ops.unit == "head")]
    seeds = int(best.seeds)
    n = int(best.min_heads)
    heads = ev.least_important(r.tables.get("importance", pd.DataFrame()), best.method, n)
    if heads and len(heads) == n:
        which = f": {', '.join(heads)}, the same in every seed"
    elif len(heads) > 6:
        which = f"; {len(heads)} of them among the {n} least important in every seed"
    elif heads:
        which = f"; only {', '.join(heads)} among the {n} least important in every seed"
    else:
        which = ""
    text = (
        f"with {r.criterion()} in every one of {counted(seeds, 'seed')}, "
        f"{best.method} importance "
        f"removes {ev.share_range(best.min_fraction, best.max_fraction)} of the "
        f"{r.n_heads} heads ({n}{which})"
    )
    if not rand.empty:
        x = rand.iloc[0]
        text += f", random rankings {ev.share_range(x.min_fraction, x.max_fraction)}"
    speed = _speed_at(r, best.method, best.unit, best.min_heads)
    if speed:
        text += f"; the pruned model runs at {speed}"
    groups = r.ops[(r.ops.method != "random") & (r.ops.unit == "group")]
    if not groups.empty:
        g = groups.iloc[0]
        text += (f"; whole key/value groups by {g.method}: "
                 f"{ev.share_range(g.min_fraction, g.max_fraction)} of the heads")  # fmt: skip
    sentence = _roles_clause(r) + text + _knockout_clause(r) + "."
    return sentence[0].upper() + sentence[1:]


def _roles_clause(r: Findings) -> str:
    parts = [t for t in (r.tables.get("roles"), r.tables.get("retrieval")) if t is not None]
    if not parts:
        return ""
    counts = ev.role_counts(pd.concat(parts), r.n_heads).set_index("role")
    named = [f"{int(counts.heads[x])} {x.replace('_', '-')}" for x in
             ("induction", "sink", "retrieval") if x in counts.index]  # fmt: skip
    return f"Of {r.n_heads} heads, {', '.join(named)} heads pass their thresholds; "


def _knockout_clause(r: Findings) -> str:
    knockout = r.tables.get("knockout")
    if knockout is None or knockout.empty:
        return ""

    def moves(metric: str, what: str) -> str:
        t = ev.knockout_test(knockout, metric).iloc[-1]
        return (f"{what} from {t.unmasked:.2f} to {t.retrieval_heads:.2f}, against "
                f"{t.random_min:.2f} to {t.random_max:.2f} for {int(t.k)} random heads "
                f"(p = {t.p_value:.2f}, {counted(int(t.draws), 'draw')})")  # fmt: skip

    k = int(ev.knockout_test(knockout).iloc[-1].k)
    copy = moves("copy_accuracy", "teacher-forced copy accuracy on needle prompts")
    if "recall" not in knockout.columns:
        return f"; masking the top {k} retrieval heads moves {copy}"
    recall = moves("recall", "the needle recall of the greedy output (Wu et al.'s measure)")
    return f"; masking the top {k} retrieval heads moves {recall}, and {copy}"
