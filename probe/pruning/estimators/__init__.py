"""Importance estimators: each is one module of this package that declares itself.

A module here declares `DECLARES = Estimator(...)` (or a tuple of them, for a closely tied
pair): its name, how plots label it, what `--method`'s help says of it, its direction (low
values mark the important heads), whether it runs data-parallel, whether it differentiates the
loss, and `compute`, the function giving each head's value. `ESTIMATORS` finds them; the
command line, the study files' checks, `head_importance`, the ranking, the correlations and the
plots all read these declarations, so adding an estimator is adding one module (plus an entry
in `probe.references` when it cites a paper).

A module here must import without torch (the command line reads the declarations for its help
and its early name checks): torch, the model and the measuring code are imported inside the
functions that compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from probe.registry import Registry

if TYPE_CHECKING:
    import torch

    from probe.data.tasks import Batch
    from probe.model import Transformer

Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class Given:
    """What every estimator is given besides the model and the data."""

    seed: int = 0  # seeds what is random (the random baseline)
    progress: Progress | None = None  # called with (done, total) as the data is read
    max_batch_tokens: int | None = None  # tokens per forward (and backward) pass, checked


# model (eval mode, on its device), batches (on that device), given -> values[site] of shape
# [the site's kept heads]; a masked head's value is left out of the table
Compute = Callable[["Transformer", Sequence["Batch"], Given], list["torch.Tensor"]]


@dataclass(frozen=True)
class Estimator:
    """An importance estimator, as the rest of probe knows it."""

    name: str  # its --method name, and the `method` of its table rows
    label: str  # how plots name it
    help: str  # what --method's help says of it (a few words)
    compute: Compute  # each kept head's value, per attention site
    order: int = 100  # its place in every list of estimators ('all', help, messages)
    low_is_important: bool = False  # its lowest values mark the heads that matter (entropy)
    data_parallel: bool = False  # its per-head sums add over processes (torchrun)
    gradients: bool = False  # it differentiates the loss (zero for a self-similarity encoder)


ESTIMATORS: Registry[Estimator] = Registry("importance method", __name__, order="order")
