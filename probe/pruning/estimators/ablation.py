"""ablation and mean-ablation: the loss increase with one head removed, one head at a time
(layers x heads + 1 passes over the data).

- ablation: the head's gate at 0.
- mean-ablation: the head's output replaced by its mean over the data (over examples and
  positions) instead of by 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from probe.pruning.estimators import Estimator, Given

if TYPE_CHECKING:
    import torch

    from probe.data.tasks import Batch
    from probe.model import AttentionCall, Transformer


def mean_loss(model: Transformer, batches: Sequence[Batch],
              max_batch_tokens: int | None = None) -> float:  # fmt: skip
    """Mean per-example loss over all examples of `batches` (micro-batches of at most
    `max_batch_tokens` tokens; None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`)."""
    import torch

    from probe.measure.batching import micro_batches
    from probe.measure.evaluate import batch_loss

    total, n = 0.0, 0
    with torch.no_grad():
        for batch in micro_batches(batches, max_batch_tokens):
            total += batch_loss(model, batch, reduction="none").double().sum().item()
            n += batch.inputs.shape[0]
    return total / max(n, 1)


class _HeadMeans:
    """Sum and count of each site's head outputs over examples and positions."""

    needs_weights = False

    def __init__(self) -> None:
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def record(self, call: AttentionCall) -> None:
        out = call.head_out.detach().double()  # [batch, head, q, d_head]
        self.sums[call.layer] = self.sums.get(call.layer, 0) + out.sum(dim=(0, 2))  # [head, d]
        self.counts[call.layer] = self.counts.get(call.layer, 0) + out.shape[0] * out.shape[2]


def _replace_with_mean(attn, local: int, mean: torch.Tensor):
    """At attn's `heads` point, `mean` [d_head] in place of head `local`'s output, until the
    returned handle's `remove()`."""
    from probe.model.points import Intervention

    lo, hi = local * attn.d_head, (local + 1) * attn.d_head

    def replace(merged: torch.Tensor) -> torch.Tensor:
        merged = merged.clone()  # [batch, q, head * d_head]
        merged[..., lo:hi] = mean.to(merged.dtype)
        return merged

    return Intervention(attn, {"heads": replace}).attach()


def _ablation(model: Transformer, batches: Sequence[Batch], given: Given, *,
              mean: bool) -> list[torch.Tensor]:  # fmt: skip
    import torch

    with torch.no_grad():
        budget = given.max_batch_tokens
        mods = model.attention_modules()
        means = None
        if mean:
            observer = _HeadMeans()
            with model.observe(observer):
                mean_loss(model, batches, budget)
            means = {k: observer.sums[k] / observer.counts[k] for k in observer.sums}  # [head, d]
        base = mean_loss(model, batches, budget)
        values = [torch.full((m.n_kept,), float("nan")) for m in mods]  # [kept head] each
        todo = [(m, i) for m in mods for i in range(m.n_kept) if float(m.gate[i]) != 0.0]
        for step, (m, i) in enumerate(todo):
            if mean:
                handle = _replace_with_mean(m, i, means[m.layer][i])
                try:
                    values[m.layer][i] = mean_loss(model, batches, budget) - base
                finally:
                    handle.remove()
            else:
                old = float(m.gate[i])
                m.gate[i] = 0.0
                try:
                    values[m.layer][i] = mean_loss(model, batches, budget) - base
                finally:
                    m.gate[i] = old
            if given.progress is not None:
                given.progress(step + 1, len(todo))
        return values


DECLARES = (
    Estimator("ablation", "ablation (Δ loss, gate 0)", "loss increase with the head's gate at 0",
              partial(_ablation, mean=False), order=30),
    Estimator("mean-ablation", "mean ablation (Δ loss)",
              "loss increase with the head's output at its mean",
              partial(_ablation, mean=True), order=40),
)  # fmt: skip
