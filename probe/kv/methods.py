"""Choosing a `KVPlan`: which key/value heads keep the full cache.

Every method gives each key/value head of every causal self-attention site one score; the
`round(full_share * total)` best-scored key/value heads over the whole model keep the full cache
(one global budget across layers, as DuoAttention and HeadKV spend it; `total` is the number of
key/value heads the model still has; rounded half up, and a share above 0 keeps at least one).
Ties go to the earlier layer, then the lower key/value head id. The others stream: the first
`sink` tokens and the last `window`.

Scores are measured per query head; a key/value head's score is the MAX over the query heads
that read it (a grouped-query group keeps the full cache when any of its heads needs it), so a
group moves together. Methods:

- `retrieval`: Wu et al. 2024's retrieval score (`probe.analysis.retrieval`) on needle prompts;
- `razor`: RazorAttention's echo and induction scores (`probe.kv.razor`), the larger of the two;
- `duo`: DuoAttention's gate alpha per key/value head, trained on passkey prompts
  (`probe.kv.duo`; already per key/value head);
- `random`: a seeded uniform draw per key/value head (the baseline any score should beat);
- `streaming`: every head streams (no full heads; no scores);
- `full`: every head keeps the full cache (no scores).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from probe.config import Arch
from probe.errors import ProbeError
from probe.kv.plan import METHODS, KVPlan
from probe.model import Transformer

SCORE_COLUMNS = ["layer", "site", "kv_head", "method", "value"]
HEAD_COLUMNS = ["layer", "site", "head", "kv_head", "statistic", "value"]


@dataclass(frozen=True)
class PlanResult:
    plan: KVPlan
    scores: pd.DataFrame  # SCORE_COLUMNS: the key/value-head score the plan ranked by
    heads: pd.DataFrame  # HEAD_COLUMNS: the per-query-head scores behind it (empty if none)
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


def full_count(share: float, total: int) -> int:
    """How many key/value heads keep the full cache: share * total rounded half up, at least one
    when the share is above 0."""
    if not 0.0 <= share <= 1.0:
        raise ProbeError(f"the full-head share must be in [0, 1], got {share}.")
    n = math.floor(share * total + 0.5)
    return max(n, 1) if share > 0 and total > 0 else n


def kv_table(heads: pd.DataFrame, cfg, statistics: Sequence[str], method: str) -> pd.DataFrame:
    """Per key/value head: the max over its query heads of the max over `statistics`
    (`heads`: layer, head, statistic, value); every key/value head the model keeps gets a row
    (NaN when no query head of it was scored)."""
    sites = cfg.sites()
    picked = heads[heads["statistic"].isin(statistics)]
    best: dict[tuple[int, int], float] = {}
    for r in picked.itertuples():
        if r.value != r.value:  # NaN: not scored
            continue
        key = (int(r.layer), sites[int(r.layer)].group(int(r.head)))
        best[key] = max(best.get(key, -math.inf), float(r.value))
    rows = [{"layer": s.index, "site": s.name, "kv_head": g, "method": method,
             "value": best.get((s.index, g), math.nan)}
            for s in sites for g in s.kept_groups]  # fmt: skip
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def choose_full(scores: pd.DataFrame, cfg, share: float) -> tuple[tuple[int, ...], ...]:
    """Per site, the key/value heads among the `full_count` best `scores` (SCORE_COLUMNS) over
    the whole model; NaN ranks last."""
    n = full_count(share, len(scores))
    ranked = scores.assign(_v=scores["value"].fillna(-math.inf))
    ranked = ranked.sort_values(["_v", "layer", "kv_head"], ascending=[False, True, True],
                                kind="stable")  # fmt: skip
    keep = {(int(r.layer), int(r.kv_head)) for r in ranked.head(n).itertuples()}
    return tuple(tuple(g for g in s.kept_groups if (s.index, g) in keep) for s in cfg.sites())


def _with_groups(heads: pd.DataFrame, cfg) -> pd.DataFrame:
    sites = cfg.sites()
    kv = [sites[int(r.layer)].group(int(r.head)) for r in heads.itertuples()]
    return heads.assign(kv_head=kv)[HEAD_COLUMNS]


def retrieval_heads(model: Transformer, prompts) -> tuple[pd.DataFrame, dict]:
    """Wu et al.'s retrieval score per query head (statistic "retrieval") and the prompts it
    rests on; one line when the model retrieved none of the needles (the score is then
    undefined)."""
    from probe.analysis.retrieval import retrieval_scores

    table = retrieval_scores(model, prompts)
    if table.empty or int(table["prompts"].iloc[0]) == 0:
        recall = float(table["recall"].iloc[0]) if not table.empty else 0.0
        raise ProbeError(
            f"the model copied none of the {len(prompts)} needles (mean needle recall "
            f"{recall:.2f}), so retrieval scores are undefined; use more or shorter needle "
            "prompts, or another method (razor needs none)."
        )
    notes = {"needle_prompts": len(prompts), "prompts_retrieved": int(table["prompts"].iloc[0]),
             "needle_recall": float(table["recall"].iloc[0])}  # fmt: skip
    return table[["layer", "site", "head", "statistic", "value"]], notes


def make_plan(model: Transformer, method: str, full_share: float, sink: int, window: int, *,
              seed: int = 0, prompts=None, period: int = 64, rows: int = 8,
              progress: Callable[[str], None] | None = None, duo=None) -> PlanResult:  # fmt: skip
    """The plan of `method` (`probe.kv.plan.METHODS`) for `model`; `prompts` (needle prompts)
    for retrieval, `period`/`rows` (repeated random tokens) for razor, `seed` for random and
    duo, `duo` (a `probe.kv.duo.DuoSettings`, defaults when None) for duo."""
    cfg = model.cfg
    if method not in METHODS:
        raise ProbeError(f"Unknown kv-plan method '{method}'. Available: {', '.join(METHODS)}.")
    check_plannable(cfg)
    KVPlan(method, full_share, sink, window, ())  # checks share, sink and window first
    say = progress or (lambda _: None)
    sites = cfg.sites()
    heads = pd.DataFrame(columns=HEAD_COLUMNS)
    notes: dict = {}
    if method in ("streaming", "full"):
        scores = pd.DataFrame(columns=SCORE_COLUMNS)
        full = tuple(s.kept_groups if method == "full" else () for s in sites)
        share = 1.0 if method == "full" else 0.0
        return PlanResult(KVPlan(method, share, sink, window, full), scores, heads)
    if method == "random":
        gen = torch.Generator().manual_seed(seed)
        scores = kv_table(pd.DataFrame(columns=["layer", "head", "statistic", "value"]), cfg,
                          (), method)  # fmt: skip
        scores["value"] = torch.rand(len(scores), generator=gen, dtype=torch.float64).tolist()
    elif method == "duo":
        from probe.kv.duo import DuoSettings, duo_gates

        alphas, notes = duo_gates(model, sink, window, duo or DuoSettings(), seed, say)
        scores = kv_table(pd.DataFrame(columns=["layer", "head", "statistic", "value"]), cfg,
                          (), method)  # fmt: skip
        scores["value"] = [float(v) for a in alphas for v in a.tolist()]  # sites, kept groups
        heads = pd.DataFrame(
            [{"layer": s.index, "site": s.name, "head": h, "kv_head": s.group(h),
              "statistic": "duo_alpha", "value": float(a[s.kv_index()[i]])}
             for s, a in zip(sites, alphas, strict=True) for i, h in enumerate(s.kept_heads)],
            columns=HEAD_COLUMNS)  # fmt: skip
    elif method == "retrieval":
        if not prompts:
            raise ProbeError("the retrieval method needs needle prompts (at least one).")
        say(f"retrieval scores on {len(prompts)} needle prompts")
        table, notes = retrieval_heads(model, prompts)
        heads = _with_groups(table, cfg)
        scores = kv_table(heads, cfg, ("retrieval",), method)
    else:
        from probe.kv.razor import razor_scores

        say(f"echo and induction scores on {rows} repeated sequences of {period} tokens")
        heads = _with_groups(razor_scores(model, period, rows, seed), cfg)
        scores = kv_table(heads, cfg, ("echo", "induction"), method)
    full = choose_full(scores, cfg, full_share)
    return PlanResult(KVPlan(method, full_share, sink, window, full), scores, heads, notes)
