"""Per-query-row attention statistics over key tiles, with an online softmax.

For one query row with logits s_j over the keys it can see, the statistics follow from a few
running sums kept per row while the keys go past tile by tile (Milakov & Gimelshein 2018):

    m  = max_j s_j                       running maximum
    l  = sum_j exp(s_j - m)              rescaled by exp(m_old - m_new) when m grows
    u  = sum_j exp(s_j - m) (s_j - m)    likewise, plus l_old (m_old - m_new)

    log-sum-exp = m + log l,   entropy H = log l - u / l,   p_max = 1 / l

(keeping u relative to m is the same H = m + log l - u/l with u = sum exp(s - m) s, but does not
subtract two large numbers). Means and standard deviations of the logits combine across tiles with
Chan's parallel formula. Memory is O(rows x tile) instead of O(rows x keys).

Short inputs take the materialized path instead (`probe.measure.materialized`): the full logits of a
few examples at a time, worked in place, and the same row sums read off them in fewer passes over
memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from probe.measure.materialized import materialized_rows
from probe.measure.rowsums import RowSums, key_gap, visible_count
from probe.model.call import AttentionCall

# statistic -> the running sums it needs: "softmax" (m, l, u), "distance", "sink", "raw", "logit",
# "output" (the head's output), "count" (visible keys)
STATISTICS: dict[str, tuple[str, ...]] = {
    "entropy": ("softmax",),  # H = -sum p log p, nats
    "normalized_entropy": ("softmax", "count"),  # H / log(n_visible); rows seeing >= 2 keys
    "effective_keys": ("softmax",),  # exp(H)
    "p_max": ("softmax",),  # largest attention probability of the row
    # 1 when p_max > 0.9 (mean: fraction of near-one-hot rows); rows seeing >= 2 keys
    "p_max_gt_0.9": ("softmax", "count"),
    "p_max_gt_0.99": ("softmax", "count"),
    "sink_mass": ("softmax", "sink"),  # probability on key position 0
    "attention_distance": ("softmax", "distance"),  # sum_j p_j |i - j|
    "log_sum_exp": ("softmax",),
    "uniform_entropy": ("count",),  # log(n_visible): the entropy of a head spread evenly
    "max_logit": ("softmax",),  # largest logit after scaling and bias
    "logit_mean": ("logit",),  # over the visible keys, after scaling and bias
    "logit_std": ("logit",),
    "raw_logit_mean": ("raw",),  # q.k before scaling
    "raw_logit_std": ("raw",),
    "raw_logit_max": ("raw",),
    "head_out_norm": ("output",),  # || head output ||_2 at this query (after the gate)
}
# statistics whose aggregate over rows is the maximum, not the mean
MAX_STATISTICS = ("max_logit", "raw_logit_max")

STREAM_ABOVE = 512  # keys: above this many, "auto" streams over tiles
TILE_ELEMENTS = 2**20  # batch x head x query x tile elements per tile when streaming


def needs(statistics: Iterable[str]) -> set[str]:
    """The running sums a set of statistics needs."""
    return {need for name in statistics for need in STATISTICS[name]}


def tile_size(call: AttentionCall, tile: int | None = None) -> int:
    """Keys per tile so that one tile holds about TILE_ELEMENTS logits (at least 16)."""
    if tile is not None:
        return max(1, int(tile))
    b, h, q_len, _ = call.q.shape
    return max(16, TILE_ELEMENTS // max(1, b * h * q_len))


def _chan(n, mean, m2, n_t, mean_t, m2_t):
    """Combine (count, mean, sum of squared deviations) of two parts (Chan et al. 1979)."""
    total = n + n_t
    delta = mean_t - mean
    share = n_t / total.clamp_min(1)
    return total, mean + delta * share, m2 + m2_t + delta.square() * n * share


def _tile_moments(x: torch.Tensor, hidden: torch.Tensor | None, n_t: torch.Tensor):
    """(mean, sum of squared deviations) of one tile, two-pass for accuracy."""
    if hidden is None:
        var, mean = torch.var_mean(x, dim=-1, correction=0)
        return mean, var * n_t
    mean = x.masked_fill(hidden, 0.0).sum(-1) / n_t.clamp_min(1)  # [batch, head, q]
    dev = (x - mean.unsqueeze(-1)).masked_fill_(hidden, 0.0)
    return mean, dev.square().sum(-1)


def _streamed(call: AttentionCall, need: set[str], width: int) -> RowSums:
    """Row sums over key tiles of `width` with an online softmax: O(rows x width) memory."""
    b, h, q_len, _ = call.q.shape
    k_len = call.k.shape[2]
    rows_shape, device = (b, h, q_len), call.q.device
    zeros = torch.zeros(rows_shape, device=device)
    count, lsum, u, dist = zeros, zeros, zeros, zeros
    m = torch.full(rows_shape, float("-inf"), device=device)  # running max logit
    raw = {"n": zeros, "mean": zeros, "m2": zeros, "max": m}
    logit = {"n": zeros, "mean": zeros, "m2": zeros}
    sink = m
    for start in range(0, k_len, width):
        stop = min(k_len, start + width)
        raw_t, logits = call.logits(start, stop)  # [batch, head, q_len, tile] each
        hidden = None if call.visible is None else ~call.visible[..., start:stop]
        n_t = visible_count(call, start, stop)
        count = count + n_t
        if "raw" in need:
            top = raw_t if hidden is None else raw_t.masked_fill(hidden, float("-inf"))
            raw["max"] = torch.maximum(raw["max"], top.amax(-1))
            raw["n"], raw["mean"], raw["m2"] = _chan(
                raw["n"], raw["mean"], raw["m2"], n_t, *_tile_moments(raw_t, hidden, n_t)
            )
        if "logit" in need:
            logit["n"], logit["mean"], logit["m2"] = _chan(
                logit["n"], logit["mean"], logit["m2"], n_t, *_tile_moments(logits, hidden, n_t)
            )
        if "softmax" not in need:
            continue
        if start == 0:
            sink = logits[..., 0]  # [batch, head, q]
        m_new = torch.maximum(m, logits.amax(-1))  # [batch, head, q]
        m_safe = torch.where(torch.isfinite(m_new), m_new, 0.0)
        z = logits - m_safe.unsqueeze(-1)  # [batch, head, q, tile], -inf where invisible
        e = z.exp()  # [batch, head, q, tile], 0 where invisible
        shift = (m - m_safe).clamp_min(-1e30)  # <= 0; -1e30 where no key was seen yet
        alpha = shift.exp()
        u = alpha * (u + lsum * shift) + (e * z).nan_to_num_(nan=0.0).sum(-1)
        lsum = alpha * lsum + e.sum(-1)
        if "distance" in need:
            dist = alpha * dist + (e * key_gap(call, start, stop)).sum(-1)
        m = m_new
    n = count.clamp_min(1)
    return RowSums(
        count=count,
        m=m,
        lsum=lsum,
        u=u,
        dist=dist,
        sink=sink,
        raw_mean=raw["mean"],
        raw_var=raw["m2"] / n,
        raw_max=raw["max"],
        logit_mean=logit["mean"],
        logit_var=logit["m2"] / n,
    )


def row_values(
    call: AttentionCall,
    statistics: Sequence[str],
    tile: int | None = None,
    stream: bool = False,
) -> torch.Tensor:
    """Statistics of every query row, stacked: [statistic, batch, head, q_len] float.

    Rows that see no key are NaN, and so are rows that see a single key for normalized_entropy
    and the p_max_gt fractions. With `stream`, keys go past in tiles of `tile` (default: about
    TILE_ELEMENTS logits per tile); otherwise the logits are materialized, a few examples at a
    time (`probe.measure.materialized`).
    """
    need = needs(statistics)
    if stream:
        return _finish(statistics, _streamed(call, need, tile_size(call, tile)), call)
    return _finish(statistics, materialized_rows(call, need)[0], call)


def rows_and_output(
    call: AttentionCall, statistics: Sequence[str]
) -> tuple[RowSums, torch.Tensor | None]:
    """Materialized row sums, plus the attention output softmax(logits) @ v computed from the
    same weights when the statistics need the softmax (None otherwise): an observer can hand
    that output to the model instead of letting it run attention a second time."""
    return materialized_rows(call, needs(statistics), output=True)


def finish_rows(call: AttentionCall, statistics: Sequence[str], rows: RowSums) -> torch.Tensor:
    """[statistic, batch, head, q_len] from row sums of `rows_and_output` (after the call's
    head_out is known)."""
    return _finish(statistics, rows, call)


def row_statistics(
    call: AttentionCall,
    statistics: Iterable[str] = tuple(STATISTICS),
    tile: int | None = None,
    stream: bool = False,
) -> dict[str, torch.Tensor]:
    """`row_values` as a dict: statistic name -> [batch, head, q_len]."""
    statistics = list(statistics)
    values = row_values(call, statistics, tile, stream)
    return dict(zip(statistics, values.unbind(0), strict=True))


def _finish(statistics: Sequence[str], rows: RowSums, call: AttentionCall) -> torch.Tensor:
    """[statistic, batch, head, q] from the row sums, with as few small ops as possible."""
    count = rows.count
    seen = count[:, :1]  # [batch, 1, q]: keys seen, the same for every head
    nan = float("nan")
    # the fewest keys a row sees: rows seeing none, or one, are NaN only when there are some
    fewest = call.k.shape[2] if call.visible is None else int(seen.amin()) if seen.numel() else 0
    single = torch.where(seen > 1, 0.0, nan) if fewest < 2 else None  # one key says nothing
    cache: dict[str, torch.Tensor] = {}

    def get(key: str) -> torch.Tensor:
        if key not in cache:
            if key == "inv_l":
                cache[key] = rows.lsum.reciprocal()
            elif key == "log_l":
                cache[key] = rows.lsum.log()
            elif key == "entropy":  # log l - u / l
                cache[key] = torch.addcmul(get("log_l"), rows.u, get("inv_l"), value=-1.0)
                cache[key].clamp_min_(0.0)
        return cache[key]

    values: list[torch.Tensor] = []
    for name in statistics:
        if name == "entropy":
            value = get("entropy")
        elif name == "normalized_entropy":
            value = get("entropy") / seen.clamp_min(2).log()
            value = value if single is None else value + single
        elif name == "effective_keys":
            value = get("entropy").exp()
        elif name == "p_max":
            value = get("inv_l")
        elif name in ("p_max_gt_0.9", "p_max_gt_0.99"):
            threshold = 0.9 if name == "p_max_gt_0.9" else 0.99
            value = (rows.lsum < 1 / threshold).float()
            value = value if single is None else value + single
        elif name == "sink_mass":
            value = (rows.sink - rows.m).exp() * get("inv_l")
        elif name == "attention_distance":
            value = rows.dist * get("inv_l")
        elif name == "log_sum_exp":
            value = rows.m + get("log_l")
        elif name == "max_logit":
            value = rows.m
        elif name == "uniform_entropy":
            value = seen.clamp_min(1).log()
        elif name == "logit_mean":
            value = rows.logit_mean
        elif name == "logit_std":
            value = rows.logit_var.sqrt()
        elif name == "raw_logit_mean":
            value = rows.raw_mean
        elif name == "raw_logit_std":
            value = rows.raw_var.sqrt()
        elif name == "raw_logit_max":
            value = rows.raw_max
        elif name == "head_out_norm":
            if call.head_out is None:
                value = torch.full_like(count, nan)
            else:
                value = call.head_out.float().norm(dim=-1)  # [batch, head, q]
        else:
            raise KeyError(f"unknown attention statistic {name!r}")
        if value.shape != count.shape:
            value = value.expand_as(count)
        values.append(value.transpose(0, 1))  # [head, batch, q]
    # stored head-major, so that per-head reductions read contiguous memory
    stacked = torch.stack(values)  # [statistic, head, batch, q]
    if fewest < 1:  # rows that see no key are NaN in every statistic
        stacked += torch.where(seen > 0, 0.0, nan).transpose(0, 1)
    return stacked.transpose(1, 2)  # [statistic, batch, head, q]


def entropy_materialized(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim from the full matrix (-inf: invisible)."""
    logp = logits.log_softmax(dim=-1)
    return -(logp.exp() * logp).nan_to_num(nan=0.0).sum(-1)


def entropy_streaming(call: AttentionCall, tile: int | None = None) -> torch.Tensor:
    """Entropy per query row [batch, head, q_len] over key tiles."""
    return row_statistics(call, ["entropy"], tile=tile, stream=True)["entropy"]
