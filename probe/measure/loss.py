"""The language-model loss without a [tokens x vocab] tensor for the whole batch.

The vocabulary projection (`Transformer.logits`) and the cross-entropy run over chunks of at most
LOSS_CHUNK logits, in float32 (`probe.runtime.ACCUMULATE`) whatever the weights' dtype. When
gradients are wanted each chunk is checkpointed (`torch.utils.checkpoint`): the backward pass
recomputes one chunk's logits at a time instead of keeping every chunk's. Callers project only
the positions they score (a masked-LM batch scores 15% of its tokens), so

    hidden = model.features(tokens)                            # [batch, seq, d_model]
    loss = token_losses(model, hidden[mask], targets[mask])    # [scored tokens]

equals `F.cross_entropy(model(tokens)[mask], targets[mask], reduction="none")` up to float
rounding, with at most LOSS_CHUNK logits alive at any time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from probe.runtime import ACCUMULATE

LOSS_CHUNK = 2**22  # logits (rows x vocabulary) computed at once: 16 MiB in float32


def _rows_per_chunk(model, chunk: int) -> int:
    return max(1, chunk // model.cfg.vocab_size)


def _losses(model, hidden: torch.Tensor, targets: torch.Tensor,
            label_smoothing: float) -> torch.Tensor:  # fmt: skip
    logits = model.logits(hidden).to(ACCUMULATE)  # [rows, vocab]
    return F.cross_entropy(logits, targets, reduction="none", label_smoothing=label_smoothing)


def token_losses(
    model, hidden: torch.Tensor, targets: torch.Tensor, *, label_smoothing: float = 0.0,
    chunk: int = LOSS_CHUNK,
) -> torch.Tensor:  # fmt: skip
    """Cross-entropy (float32) of every row: hidden [rows, d_model] (the model's last hidden
    states at the scored positions), targets [rows] -> [rows]; `chunk` logits at a time."""
    per = _rows_per_chunk(model, chunk)
    if hidden.shape[0] <= per:
        return _losses(model, hidden, targets, label_smoothing)
    keep_graph = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in model.head.parameters())
    )
    parts = []
    for start in range(0, hidden.shape[0], per):
        h, t = hidden[start : start + per], targets[start : start + per]
        if keep_graph:  # backward recomputes this chunk's logits rather than keeping them
            parts.append(checkpoint(_losses, model, h, t, label_smoothing, use_reentrant=False))
        else:
            parts.append(_losses(model, h, t, label_smoothing))
    return torch.cat(parts)  # [rows]


@torch.no_grad()
def token_losses_and_hits(
    model, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = LOSS_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy [rows] float32, argmax == target [rows] bool) of every row, from one
    projection per chunk (no gradients)."""
    per = _rows_per_chunk(model, chunk)
    losses, hits = [], []
    for start in range(0, hidden.shape[0], per):
        h, t = hidden[start : start + per], targets[start : start + per]
        logits = model.logits(h).to(ACCUMULATE)  # [rows, vocab]
        losses.append(F.cross_entropy(logits, t, reduction="none"))
        hits.append(logits.argmax(-1) == t)
    if not losses:
        empty = hidden.new_zeros(0, dtype=ACCUMULATE)
        return empty, empty.bool()
    return torch.cat(losses), torch.cat(hits)


def per_example(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each example's mean over its scored tokens: token_loss [scored] (mask True, row-major
    order, as `hidden[mask]` gives them), mask [batch, seq] -> [batch] (0 with none scored)."""
    example = mask.nonzero()[:, 0]  # [scored]: the example each scored token belongs to
    sums = token_loss.new_zeros(mask.shape[0]).index_add(0, example, token_loss)  # [batch]
    return sums / mask.sum(1).clamp_min(1).to(sums.dtype)
