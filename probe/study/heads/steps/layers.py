"""The layer steps: the importance of each attention sub-layer on one seed's text split, which
the attention-layer curves (and the timing of their pruned models) rank by. No section of its
own: the curves present it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from probe.study.heads.step import Options, StepKind
from probe.study.heads.study import HeadStudy

if TYPE_CHECKING:
    from probe.study.heads.subject import Subject


def layers(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    from probe.pruning.layer_drop import layer_importance

    seed = options["seed"]
    return layer_importance(subject.model, subject.splits[0][seed]).assign(seed=seed)


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    if "attention-layer" not in study.curves.methods:
        return []
    return [(f"layers-s{seed}", {"seed": seed}) for seed in range(study.text.seeds)]


DECLARES = StepKind("layers", 2, layers, _plan)
