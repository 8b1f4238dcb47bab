"""RazorAttention's head scores (Tang et al. 2024, "RazorAttention: Efficient KV Cache
Compression Through Retrieval Heads", arXiv 2407.15891, section 3 and figure 3(b)): on repeated
random tokens, when the current token is "B" and the next is "C", an *echo* head attends to the
earlier "B" (the same token's earlier occurrence) and an *induction* head to the earlier "C"
(the token after it). Both are mean attention probabilities over the second copy of
[BOS] x_1..x_T x_1..x_T:

- echo: mean p(i -> i - T), the same token one period back;
- induction: mean p(i -> i - T + 1), the token after that one: `probe.analysis.roles`'s
  induction score (Olsson et al. 2022), which is the paper's definition, reused here.

The paper keeps the full cache for the top heads of each score separately (the top 14% by
induction and 1% by echo score): `probe.kv.methods.razor` ranks them so; `razor-max`
(`probe.kv.methods.razor_max`) ranks the larger of the two, probe's earlier rule.
"""

from __future__ import annotations

import pandas as pd
import torch

from probe.analysis.roles import InductionProbe, RepeatProbe, repeated_tokens
from probe.measure.memory import check_fits, data_bytes, forward_bytes
from probe.measure.observe import Fanout
from probe.model import Transformer


@torch.no_grad()
def razor_scores(model: Transformer, period: int = 64, rows: int = 8, seed: int = 0,
                 max_rows: int = 8) -> pd.DataFrame:  # fmt: skip
    """Echo and induction scores of every head (columns layer, site, head, statistic ("echo",
    "induction"), value) on `rows` sequences of `period` random tokens repeated twice, at most
    `max_rows` sequences per forward pass."""
    check_fits(data_bytes(1, rows, 2 * period + 1)
               + forward_bytes(model.cfg, min(rows, max_rows), 2 * period + 1),
               f"razor's {rows:,} repeated sequences of {2 * period + 1:,} tokens",
               "fewer rows (--rows) or a shorter --period")  # fmt: skip
    device = next(model.parameters()).device
    tokens = repeated_tokens(model.cfg.vocab_size, period, rows, seed).to(device)
    # echo: the same token one period back; induction: the token after it
    echo, induction = RepeatProbe(period, period, "echo"), InductionProbe(period)

    was_training = model.training
    model.eval()
    try:
        with model.observe(Fanout(echo, induction)):
            for part in tokens.split(max_rows):  # [rows, 2 * period + 1]
                model.features(part)
    finally:
        model.train(was_training)
    columns = ["layer", "site", "head", "statistic", "value"]
    return pd.concat([echo.table()[columns], induction.table()[columns]], ignore_index=True)
