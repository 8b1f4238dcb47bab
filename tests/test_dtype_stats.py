"""Attention statistics and head roles of a bf16/fp16 model are those of the same weights in
float32, within what half precision costs the forward pass (`precision.bound`), and they are
accumulated in float32: summing over many passes does not drift."""

from __future__ import annotations

import copy

import pytest
import torch
from precision import HALF, bound, rounded
from test_dtype_model import model_for

from probe.analysis.attention import head_summary, inspect_model
from probe.analysis.roles import OffsetProfile
from probe.data.tasks import TaskConfig
from probe.measure.observe import AttentionStats, Fanout

TASK = TaskConfig()
# p_max > 0.9 counts rows: a row at 0.9 flips with any rounding, so it has no error bound
THRESHOLDS = ("p_max_gt_0.9", "p_max_gt_0.99")


def inspected(model, streaming):
    return inspect_model(model, TASK, [8, 16], batch_size=8, n_batches=1, streaming=streaming)


@pytest.mark.parametrize("streaming", [False, True], ids=["materialized", "streamed"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize(
    "name", ["rope-rmsnorm-gqa-swiglu", "alibi-12-heads", "sliding-window", "encoder-decoder"]
)
def test_statistics_and_roles_of_a_half_model_match_float32(name, dtype, streaming):
    exact = rounded(model_for(name), dtype)
    half = copy.deepcopy(exact).to(dtype)
    want, got = inspected(exact, streaming), inspected(half, streaming)
    keys = ["length", "layer", "head", "statistic"]
    both = want.stats.merge(got.stats, on=keys, suffixes=("", "_half"))
    assert len(both) == len(want.stats) == len(got.stats)
    assert (both.n == both.n_half).all()
    for statistic, rows in both.groupby("statistic"):
        if statistic in THRESHOLDS:
            continue
        tol = bound(dtype, 1 + rows.value.abs().max())
        assert (rows.value - rows.value_half).abs().max() <= tol, statistic
    roles = want.roles.merge(got.roles, on=["layer", "head", "statistic"], suffixes=("", "_half"))
    assert (roles.value - roles.value_half).abs().max() <= bound(dtype, 1)  # probabilities
    summary = head_summary(got.stats, got.roles)
    assert summary.normalized_entropy.notna().all()


class Counted(AttentionStats):
    """AttentionStats that also keeps its per-pass increments, to sum them in bf16 by hand."""

    def __init__(self) -> None:
        super().__init__(["entropy", "max_logit"], streaming=False)
        self.last = None

    def record(self, call) -> None:
        before = None if call.layer not in self._sites else self._sites[call.layer].sum.clone()
        super().record(call)
        if call.layer == 0:
            after = self._sites[0].sum
            self.last = after if before is None else after - before


def test_sums_over_many_passes_are_float32_and_do_not_drift():
    """A bf16 model observed over 400 passes of one batch: the accumulated mean is the one-pass
    mean to float32 precision, where a bf16 running sum would stall far from it."""
    model = model_for("rope-rmsnorm-gqa-swiglu").to(torch.bfloat16)
    tokens = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(0))
    stats = Counted()
    with torch.no_grad(), model.observe(stats):
        model(tokens)
        once = stats.table().set_index(["layer", "head", "statistic"]).value
        increment = stats.last[0].clone()  # [head] entropy summed over one pass's rows
        passes = 400
        for _ in range(passes - 1):
            model(tokens)
    assert stats._sites[0].sum.dtype == torch.float32
    table = stats.table().set_index(["layer", "head", "statistic"])
    assert (table.n == passes * 4 * 16).all()
    assert ((table.value - once).abs() <= 1e-5 * once.abs().clip(lower=1)).all()
    total = torch.zeros_like(increment, dtype=torch.bfloat16)  # what a bf16 accumulator gives
    for _ in range(passes):
        total = total + increment.to(torch.bfloat16)
    drift = (total.float() / passes - increment).abs() / increment.abs()
    assert float(drift.max()) > 0.05


def test_offset_profile_accumulates_in_float32():
    """Role sums of a bf16 model are float32, and its sink score is the mean probability on key
    0 (rows seeing at least two keys) computed by hand in float64 from the same weights."""
    model = model_for("sliding-window").to(torch.bfloat16)
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    profile, kept = OffsetProfile(), []

    class Keep:
        needs_weights = True

        def record(self, call) -> None:
            if call.layer == 0:
                kept.append(call.probs.double())

    with torch.no_grad(), model.observe(Fanout(profile, Keep())):
        for _ in range(3):
            model(tokens)
    _, sums = profile.sites[0]["offsets"]
    assert sums.dtype == torch.float32
    assert profile.sites[0]["sink"].dtype == torch.float32
    probs = torch.cat(kept)  # [passes * batch, head, q, k] float64
    want = probs[:, :, 1:, 0].mean((0, 2))  # row 0 sees one key only
    table = profile.table()
    got = table[(table.statistic == "sink") & (table.layer == 0)].value.to_numpy()
    assert torch.allclose(torch.tensor(got), want, rtol=1e-5, atol=1e-7)
