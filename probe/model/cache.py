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

When the cut comes is the rule's `masked`: a masked rule (StreamingLLM's token-by-token
setting) shows a streaming head's query at p only the sink and the `window` keys up to p, even
within one call, so a prompt prefilled in one call is already cut at every position; an unmasked
rule (the papers' prefill: DuoAttention's and RazorAttention's reference code) lets a call's
queries see every key the cache held when the call began and the call's own keys, and cuts after
the call, so a prompt prefilled in one call is prefilled with full attention and a prompt in
chunks is cut after each chunk. `KVCache.cut` applies a plan to a full cache after the fact (a
prompt prefilled in full, then cut). One token at a time the two differ by one key: a decoding
query sees the window up to itself (masked) or the window before it and itself (unmasked).

The full forward under a plan (no cache) computes the masked rule with a mask instead:
`StreamRule.visible` hides from a streaming head the keys its cache would have evicted, and
tests/test_kv_apply.py proves the two equal. Indices below are arrival indices (the key's
column in the whole sequence); with positions 0, 1, ... they are the positions.

The cache counts the bytes it holds (`nbytes`) and the most it held at once (`peak_nbytes`): a
streaming head's keys of the current call count until they are cut.
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
    see every key; a streaming one keeps key j (arrival index) for query p when j < sink or
    p - j < window (and the site's own rule allows it). `masked`: the keep applies at every query
    of a call (else a call's queries see what the cache held and the call's keys; the cut
    follows the call)."""

    full: tuple[int, ...]
    stream: tuple[int, ...]
    sink: int
    window: int
    masked: bool = True
    # RazorAttention's buffer: the window grows to ceil(n / ratio) of the n tokens so far (0: no)
    ratio: float = 0.0
    # RazorAttention's compensation token: what a streaming head dropped, as one token
    # (`probe.model.compensate`)
    compensate: bool = False

    def windows(self, n: torch.Tensor) -> torch.Tensor:
        """The recent tokens kept when `n` [...] tokens have arrived: `window`, or RazorAttention's
        max(window, ceil(n / ratio)). It grows by at most one a token (ratio >= 1), so a key
        evicted once is never wanted again."""
        if not self.ratio:
            return torch.full_like(n, self.window)
        return torch.clamp(torch.ceil(n / self.ratio).long(), min=self.window)

    def keeps(self, p: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """p [q], j [k] arrival indices -> [q, k] bool: what a streaming head keeps for p."""
        recent = p.view(-1, 1) - j.view(1, -1) < self.windows(p + 1).view(-1, 1)
        return (j < self.sink).view(1, -1) | recent

    @classmethod
    def for_site(cls, site: Site, full: tuple[int, ...], sink: int, window: int,
                 masked: bool = True, ratio: float = 0.0,
                 compensate: bool = False) -> StreamRule | None:  # fmt: skip
        """The split of `site`'s key/value heads when the original groups `full` keep the full
        cache (None: every head is full, so nothing changes)."""
        local_full = tuple(i for i, g in enumerate(site.kept_groups) if g in full)
        stream = tuple(i for i, g in enumerate(site.kept_groups) if g not in full)
        if not stream:
            return None
        return cls(local_full, stream, sink, window, masked, ratio, compensate)

    def stays(self, kept: torch.Tensor, last: int) -> torch.Tensor:
        """[kept] bool: which of the keys at arrival indices `kept` a streaming head keeps once
        the key at `last` has arrived (every later query stands after it)."""
        window = int(self.windows(torch.tensor(last + 1)))
        return (kept < self.sink) | (kept > last - window)

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


def plan_rules(plan: Any, sites: list[Site], masked: bool = True) -> list[StreamRule | None]:
    """Per site, the rule a `KVPlan` sets (plan.full in site order)."""
    return [StreamRule.for_site(s, plan.full[s.index], plan.sink, plan.window, masked,
                                plan.buffer_ratio, plan.compensate) for s in sites]  # fmt: skip


@dataclass
class Meter:
    """The bytes a cache's sites hold now (`held`) and the most they held at once (`peak`)."""

    held: int = 0
    peak: int = 0

    def change(self, before: int, during: int, after: int) -> None:
        """One site went from `before` bytes to `after`, holding `during` on the way."""
        self.peak = max(self.peak, self.held - before + during)
        self.held += after - before


def _bytes(*parts: torch.Tensor | None) -> int:
    return sum(t.untyped_storage().nbytes() for t in parts if t is not None)


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
    # with a compensating rule: (sum of the keys dropped before this call [batch, h, d_head], of
    # their values, how many)
    dropped: tuple[torch.Tensor, torch.Tensor, int] | None = None


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
    meter: Meter = field(default_factory=Meter, repr=False)  # shared by a cache's sites
    # a compensating rule's evicted keys and values, summed (float32 [batch, stream, d_head]),
    # and how many
    dropped: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' k and v [batch, kv_head, new, d_head]; returns every key and
        value so far."""
        before = self.nbytes
        if self.k is None:  # a copy: k and v may be views into the q/k/v projection's output
            self.k = k.clone(memory_format=torch.contiguous_format)
            self.v = v.clone(memory_format=torch.contiguous_format)
        else:
            self.k = torch.cat([self.k, k], dim=2)  # [batch, kv_head, len + new, d_head]
            self.v = torch.cat([self.v, v], dim=2)
        self.meter.change(before, self.nbytes, self.nbytes)
        return self.k, self.v

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int,
               kv_index: list[int]) -> list[HeadKeys]:  # fmt: skip
        """With a rule: add the new tokens' k and v [batch, kv_head, new, d_head], arriving at
        indices start, start + 1, ... (`_append_split`), and return per group of query heads
        (kv_index: each query head's local key/value head) the keys they see: the full heads'
        every key so far, the streaming heads' the keys kept before this call and the new ones."""
        rule, dropped = self.rule, self.dropped  # what was dropped before this call
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
            gone = None
            if evicts is not None and dropped is not None:
                gone = (dropped[0].index_select(1, rows), dropped[1].index_select(1, rows),
                        dropped[2])  # fmt: skip
            seen.append(HeadKeys(idx, hk, hv, index, evicts, gone))
        return seen

    def _append_split(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[tuple, tuple]:
        """Add the new tokens' k and v [batch, kv_head, new, d_head], arriving at indices start,
        start + 1, ...; returns ((k, v) of the full heads, every key so far [batch, full, len,
        d_head]) and ((ks, vs, kept) of the streaming heads: the keys kept before this call
        and every new one, which the new queries may see). Then evicts what no later query of
        a streaming head sees: all but the first `sink` and the last `window` keys."""
        rule, before = self.rule, self.nbytes
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
        stay = rule.stays(kept, start + new - 1)  # [kept + new] bool
        if rule.compensate:
            self._drop(ks[:, :, ~stay], vs[:, :, ~stay])
        # boolean indexing copies: the evicted keys' storage is freed, not kept behind a view
        self.ks, self.vs, self.kept = ks[:, :, stay], vs[:, :, stay], kept[stay]
        sums = self.dropped[:2] if self.dropped is not None else ()
        self.meter.change(before, _bytes(kf, vf, ks, vs, *sums), self.nbytes)
        return (kf, vf), (ks, vs, kept)

    def _drop(self, ks: torch.Tensor, vs: torch.Tensor) -> None:
        """Fold evicted keys and values [batch, stream, gone, d_head] into the sums."""
        if ks.shape[2] == 0:
            return
        sk, sv = ks.float().sum(2), vs.float().sum(2)  # [batch, stream, d_head]
        if self.dropped is not None:
            sk, sv = sk + self.dropped[0], sv + self.dropped[1]
        self.dropped = (sk, sv, ks.shape[2] + (self.dropped[2] if self.dropped else 0))

    def cut(self, rule: StreamRule | None, meter: Meter) -> SiteCache:
        """A new site cache holding what `rule` keeps of this (full) site's keys, as if they
        had all arrived in one call (`_append_split`'s own cut); with no rule it shares this
        one's storage (the caches only ever concatenate, never write in place)."""
        if self.rule is not None:
            raise ValueError("only a full cache (no plan) can be cut")
        site = SiteCache(rule=rule, meter=meter)
        if rule is None or self.k is None:
            site.k, site.v = self.k, self.v
            meter.change(0, site.nbytes, site.nbytes)
        else:
            site._append_split(self.k, self.v, 0)
        return site

    @property
    def nbytes(self) -> int:
        """Bytes of the storage the cached keys and values hold (what is really allocated; a
        compensating rule's sums of the dropped keys and values too)."""
        sums = self.dropped[:2] if self.dropped is not None else ()
        return _bytes(self.k, self.v, self.ks, self.vs, *sums)


@dataclass
class KVCache:
    """Every site's cache, the absolute positions [batch, len] of the cached tokens and their
    padding mask [batch, len] (None: no padding)."""

    sites: list[SiteCache]
    plan: Any = None  # the KVPlan the sites' rules come from (None: every head full)
    positions: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    _masked: bool = field(default=False, repr=False)
    meter: Meter = field(default_factory=Meter, repr=False)  # its sites' bytes, now and at most

    @classmethod
    def empty(
        cls, n_sites: int, rules: list[StreamRule | None] | None = None, plan: Any = None
    ) -> KVCache:
        """No tokens yet; `rules` (per site, None: every head full) split heads by `plan`."""
        rules, meter = rules or [None] * n_sites, Meter()
        return cls([SiteCache(rule=rule, meter=meter) for rule in rules], plan, meter=meter)

    def clear(self) -> None:
        """Forget every cached token (the sites keep their rules), to be filled again."""
        self.meter = Meter()
        self.sites = [SiteCache(rule=site.rule, meter=self.meter) for site in self.sites]
        self.positions, self.key_mask, self._masked = None, None, False

    def cut(self, rules: list[StreamRule | None], plan: Any) -> KVCache:
        """A new cache holding what `plan`'s `rules` (per site) keep of this full cache's keys:
        a prompt prefilled with full attention, then each streaming head's cache cut to its
        sink and window. This cache is left as it was (it can be cut again for another plan);
        the new one's peak counts this one's (the prefill held every key)."""
        meter = Meter(peak=self.meter.peak)
        sites = [site.cut(rule, meter) for site, rule in zip(self.sites, rules, strict=True)]
        return KVCache(sites, plan, self.positions, self.key_mask, self._masked, meter)

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

    @property
    def peak_nbytes(self) -> int:
        """The most bytes the cached keys and values took at once (a streaming head's keys of a
        call count until they are cut)."""
        return max(self.meter.peak, self.nbytes)
