"""What every attention statistic is derived from, per query row, and the per-call quantities both
ways of computing it share (`probe.measure.streaming` over key tiles, `probe.measure.materialized`
over the full logits of a few examples at a time)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.model.call import AttentionCall


@dataclass
class RowSums:
    """What every statistic is derived from, per query row ([batch, head, q_len] each)."""

    count: torch.Tensor  # visible keys
    m: torch.Tensor | None = None  # max logit
    lsum: torch.Tensor | None = None  # l = sum exp(s - m)
    u: torch.Tensor | None = None  # sum exp(s - m) (s - m)
    dist: torch.Tensor | None = None  # sum exp(s - m) |i - j|
    sink: torch.Tensor | None = None  # logit of key 0
    raw_mean: torch.Tensor | None = None
    raw_var: torch.Tensor | None = None
    raw_max: torch.Tensor | None = None
    logit_mean: torch.Tensor | None = None
    logit_var: torch.Tensor | None = None


def visible_count(call: AttentionCall, start: int, stop: int) -> torch.Tensor:
    """Visible keys in [start, stop) per row, [batch, head, q_len] (from the unexpanded mask)."""
    b, h, q_len, _ = call.q.shape
    if call.visible is None:
        return torch.full((b, h, q_len), float(stop - start), device=call.q.device)
    n = call.visible[..., start:stop].sum(-1, dtype=torch.float32)  # [batch|1, 1, q]
    return n.expand(b, h, q_len)


def key_gap(call: AttentionCall, start: int, stop: int) -> torch.Tensor:
    """|i - j| for queries i and keys j in [start, stop): [q_len, tile]. Queries of a
    self-attention call are the last q_len key positions; cross-attention compares indices."""
    q_len, k_len = call.q.shape[2], call.k.shape[2]
    device = call.q.device
    i = torch.arange(q_len, device=device, dtype=torch.float32)
    if not call.site.cross:
        i = i + (k_len - q_len)
    j = torch.arange(start, stop, device=device, dtype=torch.float32)
    return (i.view(-1, 1) - j.view(1, -1)).abs()


def row_factor(call: AttentionCall) -> torch.Tensor:
    """The positive factor on each row's q.k: scale x length factor, [1, head, q_len|1, 1]."""
    factor = call.scale.float().view(1, -1, 1, 1)
    if call.length_factor is not None:
        factor = factor * call.length_factor.float().view(1, 1, -1, 1)
    return factor
