"""Choosing a `KVPlan`: which key/value heads keep the full cache.

Every method (`probe.kv.methods`, one module each) scores each key/value head of every causal
self-attention site, with one statistic or several (razor: induction and echo). A method that
declares no `choose` is ranked by its one statistic: the `round(full_share * total)` best-scored
key/value heads over the whole model keep the full cache (one global budget across layers, as
DuoAttention and HeadKV spend it; `total` is the number of key/value heads the model still has;
rounded half up, and a share above 0 keeps at least one). Ties go to the earlier layer, then the
lower key/value head id; NaN ranks last. A method that declares `choose` ranks its own way
(razor: the top heads of each statistic separately). The others stream: the first `sink` tokens
and the last `window`.

Scores are measured per query head; a key/value head's score is the MAX over the query heads
that read it (a grouped-query group keeps the full cache when any of its heads needs it, as
Huawei's RazorAttention tools group them), so a group moves together. The baselines
(`streaming`, `full`) pick no heads: every head streams, or every head keeps the full cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from probe.config import Arch
from probe.errors import ProbeError
from probe.kv.methods import METHODS, KVMethod
from probe.kv.plan import KVPlan
from probe.model import Transformer

SCORE_COLUMNS = ["layer", "site", "kv_head", "method", "statistic", "value"]
HEAD_COLUMNS = ["layer", "site", "head", "kv_head", "statistic", "value"]
KVHeads = tuple[tuple[int, int], ...]  # (layer, key/value head) pairs


@dataclass(frozen=True)
class PlanResult:
    plan: KVPlan
    scores: pd.DataFrame  # SCORE_COLUMNS: the key/value-head scores the plan ranked by
    heads: pd.DataFrame  # HEAD_COLUMNS: the per-query-head scores behind them (empty if none)
    notes: dict = field(default_factory=dict)  # what the scores rest on (retrieval: prompts)


def check_plannable(cfg) -> None:
    """One line unless `cfg` is a decoder with at least one attention head left."""
    if cfg.arch != Arch.DECODER:
        raise ProbeError(
            f"a key/value-cache plan needs a decoder (causal language model); this model is an "
            f"{cfg.arch.value}, which does not decode with a cache."
        )
    if not any(site.kept_heads for site in cfg.sites()):
        raise ProbeError("the model has no attention heads left, so there is no cache to plan.")


def half_up(x: float) -> int:
    """`x` rounded half up (Python's round goes half to even)."""
    return math.floor(x + 0.5)


def full_count(share: float, total: int) -> int:
    """How many key/value heads keep the full cache: share * total rounded half up, at least one
    when the share is above 0."""
    if not 0.0 <= share <= 1.0:
        raise ProbeError(f"the full-head share must be in [0, 1], got {share}.")
    n = half_up(share * total)
    return max(n, 1) if share > 0 and total > 0 else n


def kv_table(heads: pd.DataFrame, cfg, statistics: Sequence[str], method: str) -> pd.DataFrame:
    """Per key/value head: the max over its query heads of the max over `statistics`
    (`heads`: layer, head, statistic, value), as one statistic named after them ("echo";
    "max(echo, induction)"); every key/value head the model keeps gets a row (NaN when no
    query head of it was scored)."""
    sites = cfg.sites()
    picked = heads[heads["statistic"].isin(statistics)]
    best: dict[tuple[int, int], float] = {}
    for r in picked.itertuples():
        if r.value != r.value:  # NaN: not scored
            continue
        key = (int(r.layer), sites[int(r.layer)].group(int(r.head)))
        best[key] = max(best.get(key, -math.inf), float(r.value))
    name = statistics[0] if len(statistics) == 1 else f"max({', '.join(statistics)})"
    rows = [{"layer": s.index, "site": s.name, "kv_head": g, "method": method, "statistic": name,
             "value": best.get((s.index, g), math.nan)}
            for s in sites for g in s.kept_groups]  # fmt: skip
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def kv_scores(cfg, method: str, values: Iterable[float]) -> pd.DataFrame:
    """SCORE_COLUMNS from one score per key/value head, in site order, then kept-group order
    (its statistic: the method's name)."""
    rows = [{"layer": s.index, "site": s.name, "kv_head": g, "method": method, "statistic": method}
            for s in cfg.sites() for g in s.kept_groups]  # fmt: skip
    values = [float(v) for v in values]
    if len(values) != len(rows):
        raise ValueError(f"{method}: {len(values)} scores for {len(rows)} key/value heads")
    return pd.DataFrame(rows, columns=SCORE_COLUMNS[:-1]).assign(value=values)[SCORE_COLUMNS]


def with_groups(heads: pd.DataFrame, cfg) -> pd.DataFrame:
    """HEAD_COLUMNS: per-query-head scores (layer, site, head, statistic, value) with the
    key/value head each query head reads."""
    sites = cfg.sites()
    kv = [sites[int(r.layer)].group(int(r.head)) for r in heads.itertuples()]
    return heads.assign(kv_head=kv)[HEAD_COLUMNS]


def ranked(scores: pd.DataFrame, statistic: str | None = None) -> KVHeads:
    """The key/value heads of `scores` (SCORE_COLUMNS), best first, by `statistic` (None: the
    table's only one): NaN last, ties to the earlier layer, then the lower key/value head."""
    if statistic is None:
        names = scores["statistic"].unique()
        if len(names) > 1:  # a method that scores twice chooses its own way
            raise ValueError(f"scores of {sorted(names)}: plan them with scored_plan (the "
                             "method's own rule) or rank by one")  # fmt: skip
    else:
        scores = scores[scores["statistic"] == statistic]
    order = scores.assign(_v=scores["value"].fillna(-math.inf))
    order = order.sort_values(["_v", "layer", "kv_head"], ascending=[False, True, True],
                              kind="stable")  # fmt: skip
    return tuple((int(r.layer), int(r.kv_head)) for r in order.itertuples())


def by_site(keep: Iterable[tuple[int, int]], cfg) -> tuple[tuple[int, ...], ...]:
    """Per site (in `cfg.sites()` order), the key/value heads of `keep`, in kept-group order."""
    keep = set(keep)
    return tuple(tuple(g for g in s.kept_groups if (s.index, g) in keep) for s in cfg.sites())


def choose_full(scores: pd.DataFrame, cfg, share: float) -> tuple[tuple[int, ...], ...]:
    """Per site, the key/value heads among the `full_count` best `scores` (SCORE_COLUMNS, one
    statistic) over the whole model; NaN ranks last."""
    order = ranked(scores)
    return by_site(order[: full_count(share, len(order))], cfg)


def choose(how: KVMethod, scores: pd.DataFrame, cfg, share: float | None,
           options: Any) -> tuple[tuple[int, ...], ...]:  # fmt: skip
    """Per site, the key/value heads method `how` keeps full at `share` (None: the method's own
    share, for a method that has one: razor's published ratios)."""
    if how.choose is not None:
        return how.choose(scores, cfg, share, options)
    check_share(how, share)
    return choose_full(scores, cfg, share)


def check_share(how: KVMethod, share: float | None) -> None:
    """One line when `share` is None and method `how` has no share of its own."""
    if share is None and how.choose is None:
        raise ProbeError(f"the {how.name} method needs a full-head share (--full-heads): it has "
                         "none of its own.")  # fmt: skip


def scored_plan(method: str, scores: pd.DataFrame, cfg, share: float | None, sink: int,
                window: int, options: Any = None) -> KVPlan:  # fmt: skip
    """The plan of `method` from its key/value-head `scores` (a head study scores once and plans
    every share): the heads it keeps full, and the plan fields its options set. With no `share`
    the plan records the share it keeps."""
    how = METHODS.get(method)
    options = how.read(options)
    full = choose(how, scores, cfg, share, options)
    if share is None:
        share = sum(map(len, full)) / sum(len(s.kept_groups) for s in cfg.sites())
    return KVPlan(method, share, sink, window, full, **how.extra_fields(options))


def make_plan(model: Transformer, method: str, full_share: float | None, sink: int, window: int,
              *, options: Any = None, seed: int = 0, prompts: list | None = None,
              progress: Callable[[str], None] | None = None) -> PlanResult:  # fmt: skip
    """The plan of `method` (a name of `probe.kv.methods.METHODS`) for `model` at `full_share`
    (None: the method's own, where it has one): its `options` (its options class, a
    mapping of option values, or None for the defaults), `seed` for the methods that draw,
    `prompts` for those that read text (`KVMethod.prompts` builds them)."""
    how = METHODS.get(method)
    cfg = model.cfg
    check_plannable(cfg)
    options = how.read(options)
    # share, sink, window and the method's plan fields are checked before any scoring
    KVPlan(method, 0.0 if full_share is None else full_share, sink, window, (),
           **how.extra_fields(options))  # fmt: skip
    how.check_fits(cfg, options)
    if how.scores is None:  # a baseline: every head full, or none
        share = float(how.fixed_share or 0.0)
        full = tuple(s.kept_groups if share == 1.0 else () for s in cfg.sites())
        empty = pd.DataFrame(columns=HEAD_COLUMNS)
        return PlanResult(KVPlan(method, share, sink, window, full),
                          pd.DataFrame(columns=SCORE_COLUMNS), empty)  # fmt: skip
    check_share(how, full_share)
    say = progress or (lambda _: None)
    heads, scores, notes = how.scores(model, options, seed, sink, window, prompts, say)
    plan = scored_plan(method, scores, cfg, full_share, sink, window, options)
    return PlanResult(plan, scores, heads, notes)
