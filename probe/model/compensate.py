"""RazorAttention's compensation token (Tang et al. 2024, arXiv 2407.15891, section 3.3 and
Algorithm 1): a streaming head that drops keys folds them into one token whose key and value are
the means of the dropped keys and values, and which counts as the n tokens it stands for in the
softmax:

    attn(q) = (n exp(q.k_c) v_c + sum_kept exp(q.k_i) v_i) / (n exp(q.k_c) + sum_kept exp(q.k_i))

so its score is q.k_c (scaled as every score is) + log n. Keys are cached after rotary, so the
mean is of rotated keys, as the paper's Algorithm 1 compresses "the original KV cache (after
rotary transformation)". A query with nothing dropped yet has no compensation token.
"""

from __future__ import annotations

import torch

from probe.model import mask


def compensated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                dropped: torch.Tensor | None, before: tuple | None) -> torch.Tensor:  # fmt: skip
    """softmax attention of q [batch, h, q, d] (already scaled: scores are q.k) over the keys
    k, v [batch, h, len, d] it sees (`visible` [batch|1, 1|h, q, len] bool) and one compensation
    token per query: the mean of the keys and values it no longer sees because they were dropped,
    among these (`dropped` [batch|1, 1|h, q, len] bool, None: none) and before them (`before`:
    (sum of keys [batch, h, d], sum of values [batch, h, d], count), None: none). Float32 inside;
    returns [batch, h, q, d] in v's dtype."""
    qf, kf, vf = q.float(), k.float(), v.float()
    scores = (qf @ kf.transpose(-2, -1)).masked_fill(~visible, float("-inf"))  # [b, h, q, len]
    b, h, n_q, d = q.shape
    sum_k = qf.new_zeros(b, h, n_q, d)  # [b, h, q, d] the dropped keys' sum, per query
    sum_v = qf.new_zeros(b, h, n_q, d)
    count = qf.new_zeros(1, 1, n_q)  # [b|1, h|1, q] how many were dropped
    if dropped is not None:
        gone = dropped.float()  # [b|1, 1|h, q, len]
        sum_k, sum_v = sum_k + gone @ kf, sum_v + gone @ vf
        count = count + gone.sum(-1)
    if before is not None:
        sk, sv, n = before  # [b, h, d], [b, h, d], int
        sum_k, sum_v = sum_k + sk.float().unsqueeze(2), sum_v + sv.float().unsqueeze(2)
        count = count + n
    some = count > 0
    many = count.clamp(min=1.0)
    mean_k, mean_v = sum_k / many.unsqueeze(-1), sum_v / many.unsqueeze(-1)  # [b, h, q, d]
    extra = (qf * mean_k).sum(-1) + many.log()  # [b, h, q]
    extra = extra.masked_fill(~some, float("-inf"))
    probs = torch.softmax(torch.cat([scores, extra.unsqueeze(-1)], dim=-1), dim=-1)
    out = probs[..., :-1] @ vf + probs[..., -1:] * mean_v  # [b, h, q, d]
    return out.to(v.dtype)


def _scaled(q: torch.Tensor, scale: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    """q [batch, h, q, d] times its heads' scale [h] (and the length factor [q]): scores q.k."""
    q = q * scale.to(q.dtype).view(1, -1, 1, 1)
    return q if factor is None else q * factor.to(q.dtype).view(1, 1, -1, 1)


def planned(site, q, seen, p, key_mask, scale, factor) -> torch.Tensor:
    """Streaming heads' attention through an evicting cache with the compensation token: q
    [batch, h, q_len, d] at arrival indices p [q_len], `seen` the cache's `HeadKeys` for them,
    scale [h]. A masked rule drops, for each query, the seen keys it no longer keeps too."""
    visible = mask.visible_at(site, p, seen.index, key_mask)  # [batch|1, 1, q, len]
    dropped = None
    if seen.rule.masked:
        keeps = seen.rule.keeps(p, seen.index)  # [q, len]
        visible, dropped = visible & keeps, visible & ~keeps
    return compensated(_scaled(q, scale, factor), seen.k, seen.v, visible, dropped, seen.dropped)


def streamed(out, q, k, v, scale, factor, visible, stream, kv_index) -> torch.Tensor:
    """The full forward's output [batch, head, q_len, d] with the streaming heads' replaced by
    their attention with the compensation token (q, k, v [batch, head, len, d] per query head;
    `visible` the site's rule [batch|1, 1, q, k] or None; kv_index [head])."""
    q_len, k_len = q.shape[2], k.shape[2]
    p = torch.arange(k_len - q_len, k_len, device=q.device)  # [q]
    keeps = stream.keeps(p, torch.arange(k_len, device=q.device))  # [q, k]
    if visible is None:
        visible = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=q.device)
    streams = torch.isin(kv_index, torch.tensor(stream.stream, device=q.device))  # [head]
    idx = streams.nonzero().flatten()  # [h] the streaming query heads
    out = out.clone()
    out[:, idx] = compensated(_scaled(q.index_select(1, idx), scale.index_select(0, idx), factor),
                              k.index_select(1, idx), v.index_select(1, idx), visible & keeps,
                              visible & ~keeps, None)  # fmt: skip
    return out
