"""The scaling argument's numbers against theory: Var(q.k) = d_k within sampling error, entropy
log n - sigma^2 / 2 for small sigma, the softmax Jacobian norm against its closed form."""

from __future__ import annotations

import math

import pytest
import torch

from probe.analysis.scaling import (
    INIT_COLUMNS,
    TRAIN_COLUMNS,
    init_scaling,
    scale_factor,
    softmax_statistics,
    train_scaling,
)
from probe.errors import ProbeError


def relative_sampling_std(d: int, n_queries: int, n_keys: int) -> float:
    """Std of the pooled variance estimate of q.k over a query x key grid, relative to d:
    Var(mean X^2) ~ (2d^2 + 6d) / (Qn) + 2d / Q + 2d / n, from Var|q|^2 = 2d shared by a row
    and Var|k|^2 = 2d shared by a column."""
    var = (2 * d * d + 6 * d) / (n_queries * n_keys) + 2 * d / n_queries + 2 * d / n_keys
    return math.sqrt(var) / d


@pytest.mark.parametrize("d_k", [8, 16, 32, 64, 128, 256, 512])
def test_score_variance_matches_d_k_within_sampling_error(d_k):
    table = init_scaling([d_k], [128], ["none", "sqrt", "inverse"], n_queries=512, seed=d_k)
    var = table[table.statistic == "score_var"].set_index("scale").value
    tolerance = 4 * relative_sampling_std(d_k, 512, 128)
    assert abs(var["none"] / d_k - 1) < tolerance
    assert abs(var["sqrt"] - 1) < tolerance
    assert abs(var["inverse"] * d_k - 1) < tolerance


@pytest.mark.parametrize("sigma", [0.1, 0.3, 0.5])
def test_entropy_is_log_n_minus_half_variance_for_small_sigma(sigma):
    """Gaussian logits of std sigma << sqrt(2 ln n): H ~ log n - sigma^2 / 2 (second order)."""
    d, n = 64, 1024
    g = torch.Generator().manual_seed(1)
    stats = softmax_statistics(d, n, sigma / math.sqrt(d), n_queries=256, generator=g)
    expected = math.log(n) - sigma**2 / 2
    # third-order terms and the spread of |q|^2 / d between rows: well below sigma^2 / 10
    assert stats["entropy"] == pytest.approx(expected, abs=max(0.1 * sigma**2, 2e-3))
    assert stats["normalized_entropy"] == pytest.approx(expected / math.log(n), abs=0.01)


def test_reference_table_directions():
    """REFERENCES.md: d_k=64, n=128 scaled ~0.90 and unscaled ~0.13 of log n with ~41% of rows
    near one-hot; d_k=256 unscaled ~0.07 and ~65%; n=1024 scaled ~0.93."""
    t = init_scaling([64, 256], [128, 1024], ["sqrt", "none"], n_queries=512, seed=0)
    v = t.set_index(["d_k", "n", "scale", "statistic"]).value
    assert v[(64, 128, "sqrt", "normalized_entropy")] == pytest.approx(0.90, abs=0.02)
    assert v[(64, 128, "sqrt", "p_max_gt_0.9")] == 0
    assert v[(64, 128, "none", "normalized_entropy")] == pytest.approx(0.13, abs=0.03)
    assert v[(64, 128, "none", "p_max_gt_0.9")] == pytest.approx(0.41, abs=0.06)
    assert v[(256, 128, "none", "normalized_entropy")] == pytest.approx(0.07, abs=0.02)
    assert v[(256, 128, "none", "p_max_gt_0.9")] == pytest.approx(0.65, abs=0.06)
    assert v[(64, 1024, "sqrt", "normalized_entropy")] == pytest.approx(0.93, abs=0.02)
    assert v[(64, 128, "none", "score_std")] == pytest.approx(8.0, rel=0.1)


def test_jacobian_norm_matches_autograd():
    """The closed form sqrt(sum p^2 - 2 sum p^3 + (sum p^2)^2) against the explicit Jacobian."""
    g = torch.Generator().manual_seed(0)
    stats = softmax_statistics(16, 12, 1.0, n_queries=5, generator=g)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 16, generator=g, dtype=torch.float64)
    k = torch.randn(12, 16, generator=g, dtype=torch.float64)
    norms = []
    for row in q @ k.T:
        jac = torch.autograd.functional.jacobian(lambda s: s.softmax(-1), row)
        norms.append(float(torch.linalg.matrix_norm(jac)))
    assert stats["softmax_jacobian_norm"] == pytest.approx(sum(norms) / len(norms), rel=1e-9)


def test_uniform_jacobian_is_about_one_over_sqrt_n():
    g = torch.Generator().manual_seed(0)
    stats = softmax_statistics(8, 400, 0.0, n_queries=4, generator=g)
    assert stats["softmax_jacobian_norm"] == pytest.approx(math.sqrt(1 / 400 - 1 / 400**2))
    assert stats["entropy"] == pytest.approx(math.log(400), abs=1e-5)


def test_table_shape_and_errors():
    t = init_scaling([8, 16], [32], n_queries=16)
    assert list(t.columns) == INIT_COLUMNS
    assert set(t.scale) == {"sqrt", "none", "inverse"}
    assert {"score_var", "entropy", "normalized_entropy", "p_max_gt_0.9"} <= set(t.statistic)
    with pytest.raises(ProbeError, match="Did you mean 'sqrt'"):
        init_scaling([8], [32], ["sqtr"])
    with pytest.raises(ProbeError):
        scale_factor("learned", 8)


def test_train_scaling_curves():
    curves = train_scaling(
        16, ["sqrt", "none"], steps=6, stats_every=3, device="cpu", train_len=(4, 5)
    )
    assert list(curves.columns) == TRAIN_COLUMNS
    assert set(curves.scale) == {"sqrt", "none"}
    assert {"loss", "exact_match", "entropy", "max_logit"} <= set(curves.statistic)
    per_head = curves[curves.statistic == "entropy"]
    assert set(per_head.step) == {3, 6} and per_head["head"].nunique() == 2
