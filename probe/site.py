"""An attention site: one attention sub-layer, named by its module path.

`ModelConfig.sites()` builds them; the attention module holds its own; every table and plot joins
on `Site.name` (with `Site.index`, the `layer` column). Heads keep their ORIGINAL ids through any
pruning. With grouped-query attention, query head h reads key/value head `group(h)`: groups of
`n_head // n_kv_head` consecutive query heads share one (Ainslie et al. 2023). A causal site may
have a sliding window: a query then sees only the last `window` keys, itself included
(`probe.model.mask` is the one rule every attention path and statistic reads).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from probe.errors import ProbeError


@dataclass(frozen=True)
class Site:
    name: str  # the module path, e.g. "blocks.0.attn", "encoder.1.attn", "blocks.0.cross"
    index: int  # position in the model's site order: the `layer` column of every table
    cross: bool  # keys and values come from the encoder's output
    causal: bool  # a query sees only the keys at or before its position
    n_head: int  # query heads before any pruning
    n_kv_head: int  # key/value heads before any pruning (n_head: ordinary multi-head)
    kept_heads: tuple[int, ...]  # original ids of the query heads this site holds
    # causal self-attention only: query i sees keys j with i - window < j <= i (None: all j <= i)
    window: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None and (self.window < 1 or not self.causal or self.cross):
            raise ProbeError(
                f"{self.name}: a sliding window needs causal self-attention and at least 1 key, "
                f"got window {self.window} (causal {self.causal}, cross {self.cross})."
            )
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ProbeError(
                f"{self.name}: n_head ({self.n_head}) must be a multiple of n_kv_head "
                f"({self.n_kv_head})."
            )
        kept = self.kept_heads
        if len(set(kept)) != len(kept) or any(not 0 <= h < self.n_head for h in kept):
            raise ProbeError(
                f"kept_heads for {self.name} must be distinct ids in 0..{self.n_head - 1}, "
                f"got {kept}."
            )

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_kv_head

    @property
    def grouped(self) -> bool:
        """True for grouped-query (or multi-query) attention."""
        return self.n_kv_head < self.n_head

    def group(self, head: int) -> int:
        """The key/value head (original id) that query head `head` (original id) reads."""
        return head // self.group_size

    @property
    def kept_groups(self) -> tuple[int, ...]:
        """Original ids of the key/value heads some kept query head still reads, in order."""
        return tuple(sorted({self.group(h) for h in self.kept_heads}))

    def group_heads(self, group: int) -> tuple[int, ...]:
        """The kept query heads (original ids) that read key/value head `group`."""
        return tuple(h for h in self.kept_heads if self.group(h) == group)

    def kv_index(self) -> list[int]:
        """For each kept query head, the local index of its key/value head among kept_groups."""
        local = {g: i for i, g in enumerate(self.kept_groups)}
        return [local[self.group(h)] for h in self.kept_heads]

    def without(self, heads: Iterable[int]) -> Site:
        """This site with the given query heads (original ids) removed."""
        gone = set(heads)
        return replace(self, kept_heads=tuple(h for h in self.kept_heads if h not in gone))
