"""Head roles: how much each head behaves like a previous-token, induction, fixed-offset
positional or sink head.

Scores are mean attention probabilities, in [0, 1]:

- previous_token: mean p(i -> i - 1) over query rows that see at least two keys;
- positional: the largest mean p(i -> i + o) over relative offsets o that at least half of the
  query rows can see (the best offset goes in `offset`); a previous-token head is also a
  positional head with offset -1, and a head that attends to itself one with offset 0;
- sink: mean probability on key position 0 (Xiao et al. 2023's attention sinks);
- induction: on sequences [BOS] x_1..x_T x_1..x_T of random tokens, mean p(i -> the token after
  the previous occurrence of x_i), over the second copy (Olsson et al. 2022).

Cross-attention has no previous-token or induction score (NaN); its positional offset compares
the decoder position with the source position (0: the diagonal alignment of a copy).

The observers summarise each attention call on the fly (sums per head and per relative offset),
so no n x n matrix is kept after the call.

The table is long (`probe.schema.ROLE_COLUMNS`): `statistic` names the role, `value`
holds its score. Whether a head *has* a role is `has_role`, by the thresholds in
`ROLE_THRESHOLDS`, one per role, each with its source; every report that counts heads with a
role reads them from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from probe.data.tasks import BOS, N_SPECIAL, Batch
from probe.measure.batching import micro_batches, rows_per_pass
from probe.measure.evaluate import features_batch
from probe.model import AttentionCall, Transformer
from probe.schema import ROLE_COLUMNS

ROLES = ("previous_token", "induction", "positional", "sink")


@dataclass(frozen=True)
class RoleThreshold:
    """A head has the role when its score reaches `value` (exceeds it when `strict`)."""

    value: float
    strict: bool
    source: str  # where the number comes from


# "head h has role R": one threshold per role. Only Wu et al. define a threshold for their score;
# the papers behind the other roles define the score (what the head attends to), not a cut-off,
# so those are probe's own, stated as such in the reports that count them.
ROLE_THRESHOLDS = {
    "previous_token": RoleThreshold(0.5, False, "probe: at least half the attention on the "
                                    "previous token"),
    "induction": RoleThreshold(0.3, False, "probe: Olsson et al. 2022 define the score on "
                               "repeated random tokens, not a threshold"),
    "sink": RoleThreshold(0.5, False, "probe: at least half the attention on the first token "
                          "(Xiao et al. 2023 measure the share, with no per-head threshold)"),
    "retrieval": RoleThreshold(0.1, True, "Wu et al. 2024, section 2: a retrieval head has a "
                               "retrieval score larger than 0.1 (references.toml wu2024)"),
}  # fmt: skip

# A different question from "has role R": which heads give at least half their attention to
# what one role looks at, the same bar for every role (positional included), so that roles and
# arms compare on one scale. The grid studies' "Head roles" and survivor sections count it.
DOMINANT = 0.5


def has_role(role: str, scores: pd.Series) -> pd.Series:
    """Which of `scores` (of role `role`) pass the role's threshold in `ROLE_THRESHOLDS`."""
    t = ROLE_THRESHOLDS[role]
    return scores > t.value if t.strict else scores >= t.value


def _row_weight(call: AttentionCall) -> torch.Tensor:
    """[batch|1, 1, q, 1] float: 1 for query rows that see at least two keys."""
    if call.visible is None:
        k_len = call.k.shape[2]
        return torch.full((1, 1, call.q.shape[2], 1), float(k_len > 1), device=call.q.device)
    return (call.visible.sum(-1, keepdim=True) > 1).float()


def _add_at(store: tuple[int, torch.Tensor] | None, lo: int, values: torch.Tensor):
    """Add values [..., size] whose first entry is offset `lo` into store (lo, [..., size])."""
    if store is None:
        return lo, values
    old_lo, old = store
    new_lo = min(old_lo, lo)
    new_hi = max(old_lo + old.shape[-1], lo + values.shape[-1])
    out = torch.zeros(*old.shape[:-1], new_hi - new_lo, device=old.device)
    out[..., old_lo - new_lo : old_lo - new_lo + old.shape[-1]] += old
    out[..., lo - new_lo : lo - new_lo + values.shape[-1]] += values
    return new_lo, out


class OffsetProfile:
    """Observer: per site and head, the attention summed at each relative offset o = j - i
    (key minus query position) and on key 0, over query rows that see at least two keys, with
    the number of such rows that can see offset o."""

    needs_weights = True

    def __init__(self) -> None:
        self.sites: dict[int, dict] = {}

    def record(self, call: AttentionCall) -> None:
        probs = call.probs.float()  # [batch, head, q, k]
        b, h, q_len, k_len = probs.shape
        device = probs.device
        weight = _row_weight(call).expand(b, 1, q_len, 1)  # [batch, 1, q, 1]
        seen = torch.ones(1, 1, q_len, k_len, device=device)
        if call.visible is not None:
            seen = call.visible.float()
        shift = 0 if call.site.cross else k_len - q_len  # query i is key i + shift
        i = torch.arange(q_len, device=device).view(-1, 1) + shift
        j = torch.arange(k_len, device=device).view(1, -1)
        lo = -(q_len - 1 + shift)  # smallest offset j - i
        index = (j - i - lo).reshape(-1)  # [q * k]
        size = q_len + k_len - 1
        mass = (probs * weight).sum(0).reshape(h, -1)  # [head, q * k]
        cover = (seen * weight).expand(b, 1, q_len, k_len).sum((0, 1)).reshape(-1)  # [q * k]
        by_offset = torch.zeros(h + 1, size, device=device)
        by_offset[:h].index_add_(1, index, mass)
        by_offset[h].index_add_(0, index, cover)  # rows that see each offset
        site = self.sites.setdefault(
            call.layer,
            {"site": call.site, "offsets": None, "sink": 0.0, "rows": 0.0},
        )
        site["offsets"] = _add_at(site["offsets"], lo, by_offset)
        site["sink"] = site["sink"] + (probs[..., :1] * weight).sum((0, 2, 3))  # [head]
        site["rows"] += float(weight.sum())

    def table(self) -> pd.DataFrame:
        """previous_token, positional (with its offset) and sink scores per (layer, head)."""
        records = []
        for layer in sorted(self.sites):
            site = self.sites[layer]
            lo, sums = site["offsets"]
            sums = sums.cpu()
            rows = sums[-1]  # [offsets]
            means = sums[:-1] / rows.clamp_min(1)  # [head, offsets]
            wide = rows >= 0.5 * site["rows"]  # offsets at least half of the rows can see
            best = means.masked_fill(~wide, -1.0).max(dim=1)  # [head]
            sink = (site["sink"] / max(site["rows"], 1.0)).cpu()
            prev = -1 - lo
            cross = site["site"].cross
            for h, head in enumerate(site["site"].kept_heads):
                has_prev = not cross and 0 <= prev < rows.numel() and rows[prev] > 0
                ids = {"layer": layer, "site": site["site"].name, "head": head}
                records += [
                    {
                        **ids,
                        "statistic": "previous_token",
                        "offset": -1,
                        "value": float(means[h, prev]) if has_prev else float("nan"),
                    },
                    {
                        **ids,
                        "statistic": "positional",
                        "value": float(best.values[h]),
                        "offset": int(best.indices[h]) + lo,
                    },
                    {**ids, "statistic": "sink", "value": float(sink[h]), "offset": None},
                ]
        return pd.DataFrame(records, columns=ROLE_COLUMNS)


class RepeatProbe:
    """Observer for [BOS] x_1..x_T x_1..x_T: mean p(i -> i - back) over the second copy's
    queries (positions T+1 .. 2T), reported as `statistic`."""

    needs_weights = True

    def __init__(self, period: int, back: int, statistic: str) -> None:
        self.period, self.back, self.statistic = period, back, statistic
        self.sites: dict[int, dict] = {}

    def record(self, call: AttentionCall) -> None:
        site = self.sites.setdefault(call.layer, {"site": call.site, "sum": 0.0, "rows": 0})
        if call.site.cross:
            return
        probs = call.probs.float()  # [batch, head, q, k]
        diag = torch.diagonal(probs, offset=-self.back, dim1=-2, dim2=-1)  # p(i, i - back)
        second = diag[..., self.period + 1 - self.back :]  # queries T+1 .. 2T: the second copy
        site["sum"] = site["sum"] + second.sum((0, 2))  # [head]
        site["rows"] += second.shape[0] * second.shape[2]

    def table(self) -> pd.DataFrame:
        records = []
        for layer in sorted(self.sites):
            site = self.sites[layer]
            for h, head in enumerate(site["site"].kept_heads):
                score = float(site["sum"][h]) / site["rows"] if site["rows"] else float("nan")
                records.append(
                    {
                        "layer": layer,
                        "site": site["site"].name,
                        "head": head,
                        "statistic": self.statistic,
                        "value": score,
                        "offset": None,
                    }
                )
        return pd.DataFrame(records, columns=ROLE_COLUMNS)


class InductionProbe(RepeatProbe):
    """Mean p(i -> i - T + 1) over the second copy: attention to the token after the current
    token's earlier occurrence (Olsson et al. 2022)."""

    def __init__(self, period: int) -> None:
        super().__init__(period, period - 1, "induction")


def repeated_tokens(vocab_size: int, period: int, batch_size: int, seed: int) -> torch.Tensor:
    """[batch, 2 * period + 1]: BOS then the same `period` random symbols twice."""
    if vocab_size <= N_SPECIAL:
        raise ValueError("the vocabulary has no symbols beyond the special tokens")
    generator = torch.Generator().manual_seed(seed)
    half = torch.randint(N_SPECIAL, vocab_size, (batch_size, period), generator=generator)
    bos = torch.full((batch_size, 1), BOS, dtype=torch.long)
    return torch.cat([bos, half, half], dim=1)


@torch.no_grad()
def head_roles(
    model: Transformer,
    batches: Sequence[Batch],
    *,
    period: int = 16,
    induction_batch: int = 32,
    seed: int = 0,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Role scores of every head: a tidy table with columns layer, site, head, statistic (the
    role), value (its score), offset. Previous-token, positional and sink scores come from
    `batches` (the task's data); the induction score from repeated random sequences of
    `period` tokens. Every pass holds at most `max_batch_tokens` tokens (the scores are sums
    over rows, whatever the split)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        profile = OffsetProfile()
        with model.observe(profile):
            for batch in micro_batches(batches, max_batch_tokens):
                features_batch(model, batch.to(device))
        induction = InductionProbe(period)
        tokens = repeated_tokens(model.cfg.vocab_size, period, induction_batch, seed).to(device)
        per = rows_per_pass(tokens.shape[1] * (2 if model.encoder is not None else 1),
                            max_batch_tokens)  # fmt: skip
        with model.observe(induction):
            for part in tokens.split(per):  # [rows, 2 * period + 1] each
                model.features(part, source=part if model.encoder is not None else None)
    finally:
        model.train(was_training)
    table = pd.concat([profile.table(), induction.table()], ignore_index=True)
    rank = table["statistic"].map({role: i for i, role in enumerate(ROLES)})
    table = table.assign(_rank=rank).sort_values(["layer", "head", "_rank"], kind="stable")
    return table.drop(columns="_rank").reset_index(drop=True)
