"""The position probe against independent computations: numpy's least squares, the model's own
embedding and features, the permutation equivariance of an encoder without positions."""

import numpy as np
import pytest
import torch

from probe.analysis.positions_probe import (
    COLUMNS,
    fit_ridge,
    hidden_states,
    permutation_gap,
    position_probe,
)
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches
from probe.model import Transformer

TASK = TaskConfig(n_symbols=8)


def tiny(arch="decoder", pe="none", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(arch=arch, pe=pe, vocab_size=13, n_layer=2, n_head=2, d_model=32, **kw)
    return Transformer(cfg)


def no_hooks(model: Transformer) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def r2(table, layer, length):
    rows = table[(table.layer == layer) & (table.length == length) & (table.metric == "r2")]
    return float(rows.value.iloc[0])


# ------------------------------------------------------------------------------ ridge
def test_ridge_zero_is_least_squares_with_intercept():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)) * [1, 10, 0.1, 3, 1, 5] + 7.0  # offsets and mixed scales
    y = x @ rng.normal(size=6) + 4.0 + rng.normal(size=200)
    w, b = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.0)
    want, *_ = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)
    np.testing.assert_allclose(w.numpy(), want[:-1], rtol=1e-8, atol=1e-10)
    assert b == pytest.approx(want[-1], rel=1e-8)


def test_ridge_matches_the_penalised_normal_equations():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(50, 4)) * 3.0, rng.normal(size=50)
    w, b = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.5)
    xc, yc = x - x.mean(0), y - y.mean()
    lam = 0.5 * np.trace(xc.T @ xc) / 4  # relative to the mean feature variance
    want = np.linalg.solve(xc.T @ xc + lam * np.eye(4), xc.T @ yc)
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-9)
    assert b == pytest.approx(y.mean() - x.mean(0) @ want)
    with pytest.raises(ProbeError, match="ridge"):
        fit_ridge(torch.tensor(x), torch.tensor(y), ridge=-1.0)


# ------------------------------------------------------------------------------ hidden states
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_hidden_states_are_the_embedding_then_each_block(norm):
    model = tiny(pe="sinusoidal", norm=norm)
    batches = eval_batches(TASK, "decoder", [5], batch_size=3, n_batches=2, seed=0)
    states = hidden_states(model, batches)
    tokens = torch.cat([b.inputs for b in batches])  # [6, seq]
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    assert len(states) == 3 and states[0].shape == (6, tokens.shape[1], 32)
    with torch.no_grad():
        x = model._embed(tokens, positions)
        torch.testing.assert_close(states[0], x)
        for block, state in zip(model.blocks, states[1:], strict=True):
            x = block(x, positions)
            torch.testing.assert_close(state, x)
        last = model.ln_final(x) if norm == "pre" else x
        torch.testing.assert_close(last, model.features(tokens))
    assert no_hooks(model)


def test_hooks_are_removed_even_when_the_forward_fails():
    model = tiny()
    bad = eval_batches(TASK, "decoder", [4], batch_size=2, n_batches=1, seed=0)[0]
    bad = type(bad)(bad.inputs + 100, bad.targets, bad.loss_mask, None, bad.length)
    with pytest.raises(IndexError):
        hidden_states(model, [bad])
    assert no_hooks(model) and model.training  # the training flag is restored too
    with pytest.raises(ProbeError, match="one sequence length"):
        hidden_states(model, eval_batches(TASK, "decoder", [3, 4], 2, 1, 0))


# ------------------------------------------------------------------------------ the probe
def test_table_layout_and_token_count():
    model = tiny()
    calls = []
    table = position_probe(model, TASK, [3, 5], [5, 9], batch_size=8, n_batches=2, seed=0,
                           progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    assert list(table.columns) == COLUMNS
    assert sorted(table.layer.unique()) == [0, 1, 2]
    assert set(table.metric) == {"r2", "accuracy", "mae"}
    assert table.groupby(["layer", "length"]).size().eq(3).all()
    assert table.set_index("length").seen.to_dict() == {5: True, 9: False}
    # copy in decoder form: n prompt and n answer symbols per example, BOS/SEP left out
    n_tokens = table.drop_duplicates("length").set_index("length").n_tokens.to_dict()
    assert n_tokens == {5: 2 * 5 * 16, 9: 2 * 9 * 16}
    assert calls[-1] == (8, 8) and len(calls) == 8
    assert no_hooks(model)


def test_sinusoidal_positions_are_linearly_decodable_from_the_embedding():
    # the slow sin/cos pairs are nearly linear in the position over 0..20 (angle < 0.2 rad)
    model = tiny(pe="sinusoidal")
    table = position_probe(model, TASK, [4, 6, 8], [4, 8], batch_size=32, n_batches=2, seed=0)
    assert r2(table, 0, 4) > 0.99 and r2(table, 0, 8) > 0.99
    exact = table[(table.layer == 0) & (table.metric == "accuracy")].value
    assert (exact > 0.9).all()


def test_token_embeddings_alone_carry_no_position():
    # at the one training length the probe does no better than the mean position (R^2 ~ 0);
    # across lengths it cannot even find the mean of each length, so R^2 only drops below 0
    model = tiny(pe="none")
    table = position_probe(model, TASK, [6], [6], batch_size=32, n_batches=2, seed=0)
    assert abs(r2(table, 0, 6)) < 0.05
    table = position_probe(model, TASK, [4, 6, 8], [4, 8], batch_size=32, n_batches=2, seed=0)
    assert r2(table, 0, 4) < 0.05 and r2(table, 0, 8) < 0.05


def test_encoder_without_positions_carries_none_at_any_depth():
    # equivariance: a token's state depends on its id and the set of tokens, not on its place
    table = position_probe(tiny(arch="encoder", pe="none"), TASK, [4, 6, 8], [6, 12],
                           batch_size=32, n_batches=2, seed=0)  # fmt: skip
    assert (table[table.metric == "r2"].value < 0.05).all()


def test_the_causal_mask_leaks_position_into_a_nope_decoder():
    table = position_probe(tiny(pe="none"), TASK, [4, 6, 8], [6], batch_size=32, n_batches=2,
                           seed=0)  # fmt: skip
    assert r2(table, 1, 6) > r2(table, 0, 6) + 0.1


def test_encoder_decoder_probes_the_decoder_stack_and_bad_input_is_refused():
    model = tiny(arch="encoder-decoder")
    table = position_probe(model, TASK, [3, 4], [4], batch_size=8, n_batches=1, seed=0)
    assert sorted(table.layer.unique()) == [0, 1, 2]  # embedding + 2 decoder blocks
    assert set(table.n_tokens) == {4 * 8}  # the answer symbols fed to the decoder
    with pytest.raises(ProbeError, match="training tokens"):
        position_probe(model, TASK, [1], [2], batch_size=1, n_batches=1)
    with pytest.raises(ProbeError, match="vocabulary"):
        position_probe(model, TaskConfig(n_symbols=30), [3], [3])
    with pytest.raises(ProbeError, match="learned positional table"):
        position_probe(tiny(pe="learned", max_len=12), TASK, [3], [40])


# ------------------------------------------------------------------------------ permutations
def test_permutation_gap_is_zero_only_without_positions():
    batch = eval_batches(TASK, "encoder", [8], batch_size=4, n_batches=1, seed=0)[0]
    assert permutation_gap(tiny(arch="encoder", pe="none"), batch) < 1e-5
    assert permutation_gap(tiny(arch="encoder", pe="sinusoidal"), batch) > 1e-3
    with pytest.raises(ProbeError, match="encoder"):
        permutation_gap(tiny(arch="decoder"), batch)
