"""The key/value cache of incremental decoding: per attention site the keys and values of every
token seen so far, so a new token's forward pass computes only its own q, k and v.

Keys are cached as attention uses them (after the QK-norm and rotary at their absolute
position), one row per key/value head (grouped-query attention caches each group once). The
cache also holds the absolute positions of its keys and the padding mask, which score biases
(ALiBi, T5, FIRE) and the visibility rule (causal, sliding window) read.

With a key/value plan (`probe.kv.plan.KVPlan`, applied by `Transformer.new_cache(plan)`), a
site holds its full key/value heads and its streaming ones apart: a streaming head's storage
keeps only the first `sink` tokens and the last `window` (StreamingLLM; DuoAttention), evicting
the rest as decoding goes. Kept keys keep their original absolute positions (rotary was applied
at those positions when they were cached; score biases read them), as DuoAttention does for its
streaming heads; StreamingLLM instead re-indexes positions within the cache (its pos_shift
attention caches keys before rotary), which probe does not do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class StreamRule:
    """How one site splits its key/value heads (local indices, in cache order): the full ones
    see every key; a streaming one sees key j (arrival index) from query p when j < sink or
    p - j < window (and the site's own rule allows it)."""

    full: tuple[int, ...]
    stream: tuple[int, ...]
    sink: int
    window: int

    def keeps(self, p: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """p [q], j [k] arrival indices -> [q, k] bool: what a streaming head keeps for p."""
        return (j < self.sink).view(1, -1) | (p.view(-1, 1) - j.view(1, -1) < self.window)


@dataclass
class SiteCache:
    """One attention site's cached keys and values ([batch, kv_head, len, d_head] each).

    With a `rule`, k and v hold only the full key/value heads and ks, vs [batch, stream,
    kept, d_head] the streaming ones' kept keys, whose arrival indices are `kept` [kept]."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    rule: StreamRule | None = None
    ks: torch.Tensor | None = None
    vs: torch.Tensor | None = None
    kept: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' k and v [batch, kv_head, new, d_head]; returns every key and
        value so far."""
        if self.k is None:  # a copy: k and v may be views into the q/k/v projection's output
            self.k = k.clone(memory_format=torch.contiguous_format)
            self.v = v.clone(memory_format=torch.contiguous_format)
        else:
            self.k = torch.cat([self.k, k], dim=2)  # [batch, kv_head, len + new, d_head]
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def append_split(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[tuple, tuple]:
        """Add the new tokens' k and v [batch, kv_head, new, d_head], arriving at indices start,
        start + 1, ...; returns ((k, v) of the full heads, every key so far [batch, full, len,
        d_head]) and ((ks, vs, kept) of the streaming heads: the keys kept before this call
        and every new one, which the new queries may see). Then evicts what no later query of
        a streaming head sees: all but the first `sink` and the last `window` keys."""
        rule = self.rule
        new = k.shape[2]
        full = torch.tensor(rule.full, dtype=torch.long, device=k.device)
        stream = torch.tensor(rule.stream, dtype=torch.long, device=k.device)
        kf, vf = k.index_select(1, full), v.index_select(1, full)  # [batch, full, new, d_head]
        if self.k is not None:
            kf, vf = torch.cat([self.k, kf], dim=2), torch.cat([self.v, vf], dim=2)
        self.k, self.v = kf, vf
        ks, vs = k.index_select(1, stream), v.index_select(1, stream)  # [b, stream, new, d]
        kept = torch.arange(start, start + new, device=k.device)  # [new]
        if self.ks is not None:
            ks, vs = torch.cat([self.ks, ks], dim=2), torch.cat([self.vs, vs], dim=2)
            kept = torch.cat([self.kept, kept])
        last = start + new - 1  # the newest arrival: every later query stands after it
        stay = (kept < rule.sink) | (kept > last - rule.window)  # [kept + new] bool
        # boolean indexing copies: the evicted keys' storage is freed, not kept behind a view
        self.ks, self.vs, self.kept = ks[:, :, stay], vs[:, :, stay], kept[stay]
        return (kf, vf), (ks, vs, kept)

    @property
    def nbytes(self) -> int:
        """Bytes of the storage the cached keys and values hold (what is really allocated)."""
        parts = (self.k, self.v, self.ks, self.vs)
        return sum(t.untyped_storage().nbytes() for t in parts if t is not None)


@dataclass
class KVCache:
    """Every site's cache, the absolute positions [batch, len] of the cached tokens and their
    padding mask [batch, len] (None: no padding)."""

    sites: list[SiteCache]
    plan: Any = None  # the KVPlan the sites' rules come from (None: every head full)
    positions: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    _masked: bool = field(default=False, repr=False)

    @classmethod
    def empty(
        cls, n_sites: int, rules: list[StreamRule | None] | None = None, plan: Any = None
    ) -> KVCache:
        """No tokens yet; `rules` (per site, None: every head full) split heads by `plan`."""
        rules = rules or [None] * n_sites
        return cls([SiteCache(rule=rule) for rule in rules], plan)

    def clear(self) -> None:
        """Forget every cached token (the sites keep their rules), to be filled again."""
        self.sites = [SiteCache(rule=site.rule) for site in self.sites]
        self.positions, self.key_mask, self._masked = None, None, False

    @property
    def length(self) -> int:
        """Tokens cached so far."""
        return 0 if self.positions is None else self.positions.shape[1]

    def extend(
        self, positions: torch.Tensor, key_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Record the new tokens' positions [batch, new] and mask [batch, new] (None: no
        padding); returns the positions and mask of every key the new tokens attend to."""
        b, new = positions.shape
        if key_mask is not None or self._masked:
            old = self.key_mask
            if old is None:
                old = torch.ones(b, self.length, dtype=torch.bool, device=positions.device)
            if key_mask is None:
                key_mask = torch.ones(b, new, dtype=torch.bool, device=positions.device)
            self.key_mask, self._masked = torch.cat([old, key_mask], dim=1), True
        if self.positions is None:
            self.positions = positions
        else:
            self.positions = torch.cat([self.positions, positions], dim=1)
        return self.positions, self.key_mask

    @property
    def nbytes(self) -> int:
        """Bytes the cached keys and values take."""
        return sum(site.nbytes for site in self.sites)
