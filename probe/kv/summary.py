"""What a KV-cache study's table (`probe.kv.sweep.COLUMNS`) says: per method, share and length
the cache saved against the full cache and the passkey accuracy over seeds; per method and share
whether the issue's target holds (at least `SAVED` of the cache saved and at least `KEPT` of the
full cache's needle accuracy at every length), and whether the plan retrieves more passkeys than
a streaming-only cache of the same size (one-sided Fisher exact test on the prompts, pooled
over seeds).
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

from probe.kv.methods import head_methods
from probe.significance import ALPHA

SAVED = 0.60  # the share of the full cache a plan must save
KEPT = 0.95  # the share of the full cache's needle accuracy it must keep


def order() -> tuple[str, ...]:
    """Methods in a table's order: by share; a share's streaming last."""
    return ("full", "window", *head_methods(), "streaming")


def ordered(table: pd.DataFrame) -> pd.DataFrame:
    """Rows by full share, then method in `order()` (the baselines of share 0 and 1 first)."""
    methods = order()
    rank = table.method.map({m: i for i, m in enumerate(methods)}).fillna(len(methods))
    share = table.full_share.where(table.method != "full", -1.0)  # the full cache first
    keys = table.assign(_share=share, _rank=rank)
    by = ["_share", "_rank", "length"] if "length" in table else ["_share", "_rank"]
    return keys.sort_values(by, kind="stable").drop(columns=["_share", "_rank"])


def with_saved(kv: pd.DataFrame) -> pd.DataFrame:
    """`kv` with `saved`: 1 - kv_bytes / the full cache's kv_bytes on the same inputs (the same
    length, seed and metric), and `peak_saved` likewise of kv_peak_bytes (tables written before
    the peak was measured have none)."""
    full = kv[kv.method == "full"].set_index(["length", "seed", "metric"])
    index = pd.MultiIndex.from_frame(kv[["length", "seed", "metric"]])
    out = kv.assign(saved=1 - kv["kv_bytes"].to_numpy() / full.kv_bytes.reindex(index).to_numpy())
    if "kv_peak_bytes" in kv:
        base = full.kv_peak_bytes.reindex(index).to_numpy()
        out = out.assign(peak_saved=1 - kv["kv_peak_bytes"].to_numpy() / base)
    return out


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of k successes in n trials."""
    if n == 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    low = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return low, high


def by_length(kv: pd.DataFrame) -> pd.DataFrame:
    """Per method, full_share and length: the cache saved, needle accuracy (mean, min and max
    over seeds), exact keys (pooled over seeds, with their 95% interval) and, at the text rows'
    length, the loss and its change against the full cache."""
    kv = with_saved(kv).assign(_text=kv.metric == "loss")  # text rows apart from passkeys
    rows = []
    keys = ["method", "full_share", "length", "_text"]
    for (method, share, length, _), part in kv.groupby(keys, sort=False):
        acc = part[part.metric == "needle_accuracy"]
        exact = part[part.metric == "needle_exact"]
        loss = part[part.metric == "loss"]
        row = {"method": method, "full_share": share, "length": length,
               "full_heads": int(part.full_heads.iloc[0]),
               "saved": float(part.saved.mean())}  # fmt: skip
        if "peak_saved" in part:
            row["peak_saved"] = float(part.peak_saved.mean())
        if not acc.empty:
            k = int(float((exact.value * exact.n).sum()) + 0.5)
            n = int(exact.n.sum())
            low, high = clopper_pearson(k, n)
            row.update(needle_accuracy=acc.value.mean(), accuracy_min=acc.value.min(),
                       accuracy_max=acc.value.max(), exact=k, prompts=n, exact_low=low,
                       exact_high=high)  # fmt: skip
        if not loss.empty:
            base = kv[(kv.method == "full") & (kv.metric == "loss") & (kv.length == length)]
            row.update(loss=loss.value.mean(),
                       loss_change=loss.value.mean() - base.value.mean())  # fmt: skip
        rows.append(row)
    return ordered(pd.DataFrame(rows)).reset_index(drop=True)


def targets(table: pd.DataFrame) -> pd.DataFrame:
    """Per head method and share of a `by_length` table: the least cache saved over the passkey
    lengths, the least share of the full cache's needle accuracy kept (1 where the full cache's
    is 0), whether both targets hold at every length, and the one-sided Fisher test against
    streaming at the same memory (exact keys pooled over seeds and lengths)."""
    needles = table[table.prompts.notna()] if "prompts" in table else table.iloc[0:0]
    if "full" not in set(needles.method):
        return pd.DataFrame()  # nothing to compare with (the full cache's step has not run)
    full = needles[needles.method == "full"].set_index("length")
    rows = []
    for (method, share), part in needles.groupby(["method", "full_share"], sort=False):
        if method not in head_methods():
            continue
        part = part.set_index("length")
        base = full.needle_accuracy.reindex(part.index)
        # where the full cache retrieves nothing, a plan keeps all of it (0 of 0)
        kept = (part.needle_accuracy / base).where(base > 0, 1.0)
        stream = needles[(needles.method == "streaming") & (needles.full_share == share)]
        row = {"method": method, "full_share": share, "full_heads": int(part.full_heads.iloc[0]),
               "saved_min": float(part.saved.min()), "kept_min": float(kept.min()),
               "needle_accuracy_min": float(part.needle_accuracy.min())}  # fmt: skip
        if "peak_saved" in part:
            row["peak_saved_min"] = float(part.peak_saved.min())
        row["meets"] = bool(row["saved_min"] >= SAVED and row["kept_min"] >= KEPT)
        if not stream.empty:
            a, n = int(part.exact.sum()), int(part.prompts.sum())
            b, m = int(stream.exact.sum()), int(stream.prompts.sum())
            p = stats.fisher_exact([[a, n - a], [b, m - b]], alternative="greater")[1]
            row.update(exact=a, prompts=n, streaming_exact=b, streaming_prompts=m,
                       p_vs_streaming=float(p), beats_streaming=bool(p <= ALPHA))  # fmt: skip
        rows.append(row)
    return ordered(pd.DataFrame(rows)).reset_index(drop=True) if rows else pd.DataFrame()
