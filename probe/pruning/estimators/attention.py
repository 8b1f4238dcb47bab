"""confidence and entropy: what each head's attention pattern looks like, read in one forward
pass per batch (`probe.measure.observe.AttentionStats`, fused attention).

- confidence (Voita et al. 2019): mean over queries of the maximum attention weight.
- entropy: mean attention entropy in nats; LOW entropy = a focused head, so pruning plans rank
  low entropy as important.
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


class _SkipEmpty:
    """Passes calls on to `inner` except those of sites left without heads by pruning."""

    def __init__(self, inner) -> None:
        self.inner, self.needs_weights = inner, inner.needs_weights

    def record(self, call: AttentionCall) -> None:
        if call.q.shape[1] > 0:
            self.inner.record(call)


def _attention(model: Transformer, batches: Sequence[Batch], given: Given, *,
               statistic: str) -> list[torch.Tensor]:  # fmt: skip
    """Mean over query rows and examples of one `probe.measure.observe` statistic, per head."""
    import torch

    from probe.measure.batching import split_batch
    from probe.measure.evaluate import features_batch
    from probe.measure.observe import AttentionStats

    observer = AttentionStats([statistic])
    with torch.no_grad(), model.observe(_SkipEmpty(observer)):
        for step, batch in enumerate(batches):
            for part in split_batch(batch, given.max_batch_tokens):
                features_batch(model, part)
            if given.progress is not None:
                given.progress(step + 1, len(batches))
    table = observer.table().set_index(["layer", "head"])["value"]
    return [
        torch.tensor(
            [table.get((m.layer, h), float("nan")) for h in m.kept_heads], dtype=torch.float64
        )  # [kept head]
        for m in model.attention_modules()
    ]


DECLARES = (
    Estimator("confidence", "confidence (mean max weight)",
              "mean max attention weight, Voita et al. 2019",
              partial(_attention, statistic="p_max"), order=50),
    Estimator("entropy", "attention entropy (nats)", "mean attention entropy, low = important",
              partial(_attention, statistic="entropy"), order=60, low_is_important=True),
)  # fmt: skip
