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
attention caches keys before rotary), which probe does not do. The cache decides what it keeps:
`SiteCache.update` takes the new keys and values and returns, per group of query heads, the keys
those heads see (`HeadKeys`); attention only attends to them.

The full forward under a plan (no cache) computes the same thing with a mask instead:
`StreamRule.visible` hides from a streaming head the keys its cache would have evicted, and
tests/test_kv_apply.py proves the two equal. Indices below are arrival indices (the key's
column in the whole sequence); with positions 0, 1, ... they are the positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from probe.errors import ProbeError
from probe.site import Site


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

    @classmethod
    def for_site(cls, site: Site, full: tuple[int, ...], sink: int, window: int
                 ) -> StreamRule | None:  # fmt: skip
        """The split of `site`'s key/value heads when the original groups `full` keep the full
        cache (None: every head is full, so nothing changes)."""
        local_full = tuple(i for i, g in enumerate(site.kept_groups) if g in full)
        stream = tuple(i for i, g in enumerate(site.kept_groups) if g not in full)
        if not stream:
            return None
        return cls(local_full, stream, sink, window)

    def visible(self, kv_index: torch.Tensor, q_len: int, k_len: int,
                visible: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The full forward's mask: [batch|1, head, q_len, k_len] bool, the site's `visible`
        ([batch|1, 1, q, k] or None) and, for query heads whose key/value head streams, the
        keys a streaming head keeps (kv_index [head]: each query head's local key/value head)."""
        device = kv_index.device
        p = torch.arange(k_len - q_len, k_len, device=device)  # [q] the queries' indices
        j = torch.arange(k_len, device=device)  # [k]
        keeps = self.keeps(p, j)  # [q, k]
        streams = torch.isin(kv_index, torch.tensor(self.stream, device=device))  # [head]
        heads = keeps.unsqueeze(0) | ~streams.view(-1, 1, 1)  # [head, q, k]
        if visible is None:
            return heads.unsqueeze(0)  # [1, head, q, k]
        return visible & heads.unsqueeze(0)  # [batch|1, head, q, k]


def plan_rules(plan: Any, sites: list[Site]) -> list[StreamRule | None]:
    """Per site, the rule a `KVPlan` sets (plan.full in site order)."""
    return [StreamRule.for_site(s, plan.full[s.index], plan.sink, plan.window) for s in sites]


def check_right_padded(key_mask: torch.Tensor | None) -> None:
    """A plan counts sink and window by column (arrival index), so padding must come after
    every real token of its row (right padding); left padding would make the pads the sink."""
    if key_mask is not None and bool((~key_mask[:, :-1] & key_mask[:, 1:]).any()):
        raise ProbeError(
            "a key/value plan needs right-padded rows (padding after the real tokens): it "
            "counts sink and window by column, so left padding would make the pads the sink."
        )


@dataclass(frozen=True)
class HeadKeys:
    """What some query heads of a site see through an evicting cache: their keys and values
    [batch, h, len, d_head] (one per query head), the keys' arrival indices `index` [len] and
    the rule that evicted the others (None: every key so far is kept)."""

    heads: torch.Tensor  # [h] the query heads (local indices)
    k: torch.Tensor
    v: torch.Tensor
    index: torch.Tensor
    rule: StreamRule | None


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

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int,
               kv_index: list[int]) -> list[HeadKeys]:  # fmt: skip
        """With a rule: add the new tokens' k and v [batch, kv_head, new, d_head], arriving at
        indices start, start + 1, ... (`_append_split`), and return per group of query heads
        (kv_index: each query head's local key/value head) the keys they see: the full heads'
        every key so far, the streaming heads' the keys kept before this call and the new ones."""
        rule = self.rule
        (kf, vf), (ks, vs, kept) = self._append_split(k, v, start)
        everything = torch.arange(start + k.shape[2], device=k.device)  # [len]
        seen = []
        for group, keys, values, index, evicts in ((rule.full, kf, vf, everything, None),
                                                   (rule.stream, ks, vs, kept, rule)):  # fmt: skip
            local = {g: i for i, g in enumerate(group)}
            heads = [h for h, g in enumerate(kv_index) if g in local]
            if not heads:
                continue
            idx = torch.tensor(heads, dtype=torch.long, device=k.device)  # [h]
            rows = torch.tensor([local[kv_index[h]] for h in heads], device=k.device)  # [h]
            hk, hv = keys.index_select(1, rows), values.index_select(1, rows)  # [b, h, len, d]
            seen.append(HeadKeys(idx, hk, hv, index, evicts))
        return seen

    def _append_split(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[tuple, tuple]:
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
