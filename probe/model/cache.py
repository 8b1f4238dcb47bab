"""The key/value cache of incremental decoding: per attention site the keys and values of every
token seen so far, so a new token's forward pass computes only its own q, k and v.

Keys are cached as attention uses them (after the QK-norm and rotary at their absolute
position), one row per key/value head (grouped-query attention caches each group once). The
cache also holds the absolute positions of its keys and the padding mask, which score biases
(ALiBi, T5, FIRE) and the visibility rule (causal, sliding window) read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SiteCache:
    """One attention site's cached keys and values ([batch, kv_head, len, d_head] each)."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' k and v [batch, kv_head, new, d_head]; returns every key and
        value so far."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)  # [batch, kv_head, len + new, d_head]
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    @property
    def nbytes(self) -> int:
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


@dataclass
class KVCache:
    """Every site's cache, the absolute positions [batch, len] of the cached tokens and their
    padding mask [batch, len] (None: no padding)."""

    sites: list[SiteCache]
    positions: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    _masked: bool = field(default=False, repr=False)

    @classmethod
    def empty(cls, n_sites: int) -> KVCache:
        return cls([SiteCache() for _ in range(n_sites)])

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
