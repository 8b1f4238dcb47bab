"""Attention under a key/value plan: full key/value heads see every key, streaming ones only the
first `sink` keys and the last `window` (StreamingLLM, Xiao et al. 2024; DuoAttention, Xiao et
al. 2025), keys keeping their original absolute positions (as DuoAttention does).

Two ways compute the same thing, and tests/test_kv_apply.py proves them equal:

- the full forward (evaluation): every head reads every key; a streaming head's visibility mask
  hides the evicted ones (`per_head_visible`);
- incremental decoding with an evicting cache (`planned`): the full heads' query heads attend to
  the full heads' cache and the streaming heads' query heads to the few keys their cache keeps,
  as two separate calls, so a streaming head's keys are never padded back to the full length
  (its memory really is cut). Indices below are arrival indices (the key's column in the whole
  sequence); with positions 0, 1, ... they are the positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from probe.errors import ProbeError
from probe.model import mask
from probe.model.cache import SiteCache, StreamRule
from probe.site import Site

if TYPE_CHECKING:
    from probe.model.attention import Attention


def rule_for(site: Site, full: tuple[int, ...], sink: int, window: int) -> StreamRule | None:
    """The split of `site`'s key/value heads when the original groups `full` keep the full
    cache (None: every head is full, so nothing changes)."""
    local_full = tuple(i for i, g in enumerate(site.kept_groups) if g in full)
    stream = tuple(i for i, g in enumerate(site.kept_groups) if g not in full)
    if not stream:
        return None
    return StreamRule(local_full, stream, sink, window)


def rules(plan: Any, sites: list[Site]) -> list[StreamRule | None]:
    """Per site, the rule a `KVPlan` sets (plan.full in site order)."""
    return [rule_for(s, plan.full[s.index], plan.sink, plan.window) for s in sites]


def check_right_padded(key_mask: torch.Tensor | None) -> None:
    """A plan counts sink and window by column (arrival index), so padding must come after
    every real token of its row (right padding); left padding would make the pads the sink."""
    if key_mask is not None and bool((~key_mask[:, :-1] & key_mask[:, 1:]).any()):
        raise ProbeError(
            "a key/value plan needs right-padded rows (padding after the real tokens): it "
            "counts sink and window by column, so left padding would make the pads the sink."
        )


def per_head_visible(
    rule: StreamRule, kv_index: torch.Tensor, q_len: int, k_len: int, visible: torch.Tensor | None
) -> torch.Tensor:
    """The full forward's mask: [batch|1, head, q_len, k_len] bool, the site's `visible`
    ([batch|1, 1, q, k] or None) and, for query heads whose key/value head streams, the keys
    a streaming head keeps (kv_index [head]: each query head's local key/value head)."""
    device = kv_index.device
    p = torch.arange(k_len - q_len, k_len, device=device)  # [q] the queries' indices
    j = torch.arange(k_len, device=device)  # [k]
    keeps = rule.keeps(p, j)  # [q, k]
    streams = torch.isin(kv_index, torch.tensor(rule.stream, device=device))  # [head]
    heads = keeps.unsqueeze(0) | ~streams.view(-1, 1, 1)  # [head, q, k]
    if visible is None:
        return heads.unsqueeze(0)  # [1, head, q, k]
    return visible & heads.unsqueeze(0)  # [batch|1, head, q, k]


def _seen(attn: Attention, rule: StreamRule | None, p: torch.Tensor, j: torch.Tensor,
          key_mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """[batch|1, 1, q, k] bool: which keys j [k] queries p [q] see (causal, the site's window,
    the streaming rule when `rule` is given, padding)."""
    gap = p.view(-1, 1) - j.view(1, -1)  # [q, k]
    seen = gap >= 0
    if attn.site.window is not None:
        seen = seen & (gap < attn.site.window)
    if rule is not None:
        seen = seen & rule.keeps(p, j)
    seen = seen.view(1, 1, *seen.shape)
    if key_mask is not None:
        seen = seen & key_mask.index_select(1, j).view(key_mask.shape[0], 1, 1, -1)
    return seen


def planned(
    attn: Attention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    key_mask: torch.Tensor | None,
    cache: SiteCache,
) -> torch.Tensor:
    """Attention of the new queries q [batch, head, q_len, d_head] through a cache with a
    rule; k, v [batch, kv_head, q_len, d_head] are the new tokens' (they join the cache);
    k_pos, key_mask [batch, len] cover every token so far. Returns [batch, q_len, d_model]."""
    if attn.observer is not None:
        raise ValueError(
            "observing a model that decodes with a key/value plan is not supported; "
            "observe the full forward with `plan=` instead"
        )
    rule = cache.rule
    b, _, q_len, _ = q.shape
    k_len = k_pos.shape[1]
    factor = attn._length_factor(q_len, k_len, q.device)  # [q_len] or None: the site's rule
    start = k_len - q_len
    (kf, vf), (ks, vs, kept) = cache.append_split(k, v, start)
    p = torch.arange(start, k_len, device=q.device)  # [q_len]
    scale = attn.head_scale()  # [head]
    kv_index = attn.site.kv_index()  # per query head, its local key/value head
    out = q.new_zeros(b, q.shape[1], q_len, v.shape[-1])  # [batch, head, q_len, d_head]
    everything = torch.arange(k_len, device=q.device)
    groups = ((rule.full, kf, vf, everything, None), (rule.stream, ks, vs, kept, rule))
    for group, keys, values, j, streaming in groups:
        local = {g: i for i, g in enumerate(group)}
        heads = [h for h, g in enumerate(kv_index) if g in local]
        if not heads:
            continue
        idx = torch.tensor(heads, dtype=torch.long, device=q.device)  # [h]
        rows = torch.tensor([local[kv_index[h]] for h in heads], device=q.device)  # [h]
        hk, hv = keys.index_select(1, rows), values.index_select(1, rows)  # [b, h, k, d]
        bias = None
        if attn.score_bias is not None:  # at the kept keys' original positions
            bias = attn.score_bias.bias(q_pos, k_pos.index_select(1, j)).index_select(1, idx)
        seen = _seen(attn, streaming, p, j, key_mask)  # [batch|1, 1, q, k]
        hq = q.index_select(1, idx)  # [batch, h, q_len, d_head]
        out[:, idx] = attn.attend(hq, hk, hv, scale.index_select(0, idx), factor, bias, seen)
    out = out * attn.gate.to(out.dtype).view(1, -1, 1, 1)  # [batch, head, q_len, d_head]
    merged = out.transpose(1, 2).reshape(b, q_len, attn.n_kept * attn.d_head)
    return attn.o(merged)  # [batch, q_len, d_model]


def mixed(attn: Attention, streamed: torch.Tensor, q, k, v, scale, factor, bias,
          key_mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """DuoAttention's training-time head output (Xiao et al. 2025): per query head,
    attn.mix * full attention + (1 - attn.mix) * `streamed` (the streaming-masked output,
    [batch, head, q_len, d_head]); q, k, v [batch, head, len, d_head] as the site computed them.
    The full output is computed exactly as the plain forward computes it."""
    q_len, k_len = q.shape[2], k.shape[2]
    visible = mask.visible(attn.site, q_len, k_len, key_mask, q.device)  # [b|1, 1, q, k]
    if attn.softcap is not None:
        full = attn._capped(q, k, v, scale, factor, bias, visible)
    else:
        full = attn._fused(q, k, v, scale, factor, bias, visible, key_mask)
    gate = attn.mix.to(full.dtype).view(1, -1, 1, 1)  # [1, head, 1, 1]
    return gate * full + (1 - gate) * streamed  # [batch, head, q_len, d_head]
