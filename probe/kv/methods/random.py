"""`random`: a seeded uniform draw per key/value head, the baseline any score should beat (a
study draws it again for each seed)."""

from __future__ import annotations

from probe.kv.methods import KVMethod


def scores(model, options, seed, sink, window, prompts, say):
    import pandas as pd
    import torch

    from probe.kv.planning import HEAD_COLUMNS, kv_scores

    total = sum(len(s.kept_groups) for s in model.cfg.sites())
    gen = torch.Generator().manual_seed(seed)
    values = torch.rand(total, generator=gen, dtype=torch.float64).tolist()  # [kv heads]
    return pd.DataFrame(columns=HEAD_COLUMNS), kv_scores(model.cfg, "random", values), {}


DECLARES = KVMethod("random", 40, "", scores=scores, per_seed=True)
