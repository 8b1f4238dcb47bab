"""What an observer of attention sees: `AttentionCall`, one attention sub-layer's inputs and
outputs for one forward pass, with everything needed to rebuild its logits tile by tile; and the
`Observer` protocol an attention module calls (see `Transformer.observe`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from probe.site import Site


@dataclass
class AttentionCall:
    """One attention sub-layer's inputs and outputs for one forward pass (valid during the call).

    With grouped-query attention k and v are already expanded to one per query head."""

    site: Site  # which sub-layer (site.name joins every table)
    q: torch.Tensor  # [batch, head, q_len, d_head], after qk-norm and rotary, before scaling
    k: torch.Tensor  # [batch, head, k_len, d_head]
    v: torch.Tensor  # [batch, head, k_len, d_head]
    scale: torch.Tensor  # [head] factor on q.k
    length_factor: torch.Tensor | None  # [q_len] log-length factor on q.k, or None
    bias: torch.Tensor | None  # [batch, head, q_len, k_len] additive score bias, or None
    visible: torch.Tensor | None  # [batch|1, 1, q_len, k_len] bool, True where a key is seen
    softcap: float | None = None  # scaled logits -> softcap * tanh(logits / softcap)
    probs: torch.Tensor | None = None  # [batch, head, q_len, k_len], only when weights were asked
    head_out: torch.Tensor | None = None  # [batch, head, q_len, d_head], after the gate

    @property
    def layer(self) -> int:
        """The site's index: the `layer` column of every table."""
        return self.site.index

    @property
    def kept_heads(self) -> tuple[int, ...]:
        """Original ids of the heads present, in the order of the head dimension."""
        return self.site.kept_heads

    def logits(self, start: int = 0, stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw q.k, final logits) for keys [start, stop): [batch, head, q_len, tile] each.

        Final logits are raw * scale * length_factor, soft-capped, + bias, with -inf where a key
        is not visible: the scores the softmax of each row uses.
        """
        k = self.k[:, :, start:stop]  # [batch, head, tile, d_head]
        raw = self.q.float() @ k.float().transpose(-2, -1)  # [batch, head, q_len, tile]
        logits = raw * self.scale.float().view(1, -1, 1, 1)
        if self.length_factor is not None:
            logits = logits * self.length_factor.float().view(1, 1, -1, 1)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.bias is not None:
            logits = logits + self.bias[..., start:stop].float()
        if self.visible is not None:
            logits = logits.masked_fill(~self.visible[..., start:stop], float("-inf"))
        return raw, logits


class Observer(Protocol):
    """What an attention module calls when observed (see `Transformer.observe`).

    An observer may also define `attend(call) -> Tensor | None`, called before the output is
    computed: an observer that materializes the weights anyway can return softmax(logits) @ v
    ([batch, head, q_len, d_head]) so attention is not computed twice (None: the model does it).
    """

    needs_weights: bool  # True: run the explicit path and fill AttentionCall.probs

    def record(self, call: AttentionCall) -> None: ...
