"""random: a seeded uniform baseline (Prasanna et al. 2020): the ranking any estimator has to
beat."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from probe.pruning.estimators import Estimator, Given

if TYPE_CHECKING:
    import torch

    from probe.data.tasks import Batch
    from probe.model import Transformer


def _random(model: Transformer, batches: Sequence[Batch], given: Given) -> list[torch.Tensor]:
    import torch

    gen = torch.Generator().manual_seed(int(given.seed))
    return [torch.rand(m.n_kept, generator=gen) for m in model.attention_modules()]  # [kept head]


DECLARES = Estimator("random", "random", "a seeded baseline, Prasanna et al. 2020", _random,
                     order=70)  # fmt: skip
