"""Which keys each query of an attention call sees: the one visibility rule every path shares.

The fused path, the explicit path, the observers' statistics (`AttentionCall.visible`) and the
log-length factor all read it from here. The queries of a self-attention call are the last q_len
of its k_len positions, so query i stands at position p = k_len - q_len + i and sees key j when

    causal:           j <= p
    sliding window w: j <= p and p - j < w     (so exactly min(p + 1, w) keys)
    padding:          key_mask[b, j]

The window follows transformers exactly: `masking_utils.sliding_window_overlay` keeps
`kv_idx > q_idx - sliding_window`, and `sliding_window_causal_mask_function` ands it with
`kv_idx <= q_idx` (transformers 5.24; Mistral and Qwen2 build their sliding masks with it).
"""

from __future__ import annotations

import torch

from probe.site import Site


def _window(site: Site, k_len: int) -> int | None:
    """The site's window where it hides some key of a k_len-key call (None: it hides none)."""
    return site.window if site.window is not None and site.window < k_len else None


def plain(site: Site, q_len: int, k_len: int) -> bool:
    """True when the site's rule is no mask at all, or exactly `is_causal` of torch's SDPA
    (top-left aligned, so only when q_len == k_len), without padding."""
    if not site.causal:
        return True
    return q_len == k_len and _window(site, k_len) is None


def visible(
    site: Site,
    q_len: int,
    k_len: int,
    key_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor | None:
    """[batch|1, 1, q_len, k_len] bool, True where a query sees a key (None: it sees all).

    key_mask [batch, k_len] is False at padding."""
    seen = None
    if site.causal:
        p = torch.arange(k_len - q_len, k_len, device=device).view(-1, 1)  # [q, 1]
        j = torch.arange(k_len, device=device).view(1, -1)  # [1, k]
        gap = p - j  # [q, k] how far back each key lies
        seen = gap >= 0
        window = _window(site, k_len)
        if window is not None:
            seen = seen & (gap < window)  # i - w < j: transformers' sliding_window_overlay
        seen = seen.view(1, 1, q_len, k_len)  # [1, 1, q, k]
    if key_mask is not None:
        keys = key_mask.view(key_mask.shape[0], 1, 1, k_len)  # [batch, 1, 1, k]
        seen = keys if seen is None else seen & keys
    return seen


def visible_at(site: Site, p: torch.Tensor, j: torch.Tensor, key_mask: torch.Tensor | None,
               keeps: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """[batch|1, 1, q, k] bool: which keys of arrival indices j [k] the queries at p [q] see (an
    evicting cache's keys, not all of 0..k_len-1): causal, the site's window, `keeps` [q, k]
    (a streaming rule's) and padding (key_mask [batch, len] over every key so far)."""
    gap = p.view(-1, 1) - j.view(1, -1)  # [q, k]
    seen = gap >= 0
    if site.window is not None:
        seen = seen & (gap < site.window)
    if keeps is not None:
        seen = seen & keeps
    seen = seen.view(1, 1, *seen.shape)
    if key_mask is not None:
        seen = seen & key_mask.index_select(1, j).view(key_mask.shape[0], 1, 1, -1)
    return seen


def visible_counts(
    site: Site, q_len: int, k_len: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[q_len] float: the keys each query sees by the site's rule, before any padding."""
    if not site.causal:
        return torch.full((q_len,), float(k_len), device=device)
    n = torch.arange(k_len - q_len + 1, k_len + 1, device=device, dtype=torch.float32)
    window = _window(site, k_len)
    return n if window is None else n.clamp_max(float(window))


def softmax(logits: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim of logits that are -inf where `seen` is False; a row that sees
    no key gets zero weights, as torch's scaled_dot_product_attention gives it (not NaN, which
    would reach every row of the next layer through its values)."""
    probs = logits.softmax(dim=-1)  # [batch, head, q, k]
    if seen is None:
        return probs
    blind = ~seen.any(-1, keepdim=True)  # [batch|1, 1, q, 1]
    return probs.masked_fill(blind, 0.0) if bool(blind.any()) else probs
