"""Pruning in place: the same function as pruning a copy, with no second copy of the weights,
and a checkpoint of it that loads."""

import pandas as pd
import pytest
import torch

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.pruning.heads import prune_heads
from probe.train_config import TrainConfig


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pruning_in_place_equals_pruning_a_copy(tmp_path, dtype):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", pe="rope", vocab_size=30, d_model=32, n_head=4, n_kv_head=2,
                      n_layer=2)  # fmt: skip
    model = Transformer(cfg).eval().to(dtype)
    heads = [(0, 1), (1, 0), (1, 1)]  # layer 1 loses a whole key/value group
    copy = prune_heads(model, heads)
    tokens = torch.randint(0, 30, (2, 7))
    with torch.no_grad():
        masked = [torch.tensor([1.0, 0, 1, 1]), torch.tensor([0.0, 0, 1, 1])]
        model.set_gates([m.to(dtype) for m in masked])
        expected = model(tokens)
        model.set_gates(None)
    storage = model.embed.weight.data_ptr()
    same = prune_heads(model, heads, in_place=True)
    assert same is model and model.embed.weight.data_ptr() == storage  # nothing copied
    assert same.cfg.kept_heads == ((0, 2, 3), (2, 3)) == copy.cfg.kept_heads
    assert [m.k.out_features for m in same.attention_modules()] == [2 * 8, 8]
    with torch.no_grad():
        torch.testing.assert_close(same(tokens), expected, rtol=0, atol=0)
        torch.testing.assert_close(copy(tokens), expected, rtol=0, atol=0)
    path = save_checkpoint(tmp_path / "pruned", same, TaskConfig(), TrainConfig())
    loaded = load_checkpoint(path)
    assert loaded.model.embed.weight.dtype == dtype
    with torch.no_grad():
        assert torch.equal(loaded.model(tokens), expected)


@pytest.mark.parametrize("unit", ["head", "group"])
def test_prune_and_compare_in_place_gives_what_a_copy_gives(unit):
    from test_pruning import data, make_model

    from probe.pruning.compare import prune_and_compare

    results = {}
    for in_place in (False, True):
        model = make_model(n_kv_head=2)
        weights = model.embed.weight.data_ptr()
        results[in_place] = prune_and_compare(
            model, data(), data(seed=7), 0.5, method="gradient", unit=unit, batch_sizes=(1, 4),
            repeats=1, in_place=in_place,
        )  # fmt: skip
        if in_place:  # the input model became the pruned one: no copy of its weights
            assert results[True].model is model and model.embed.weight.data_ptr() == weights
    copy, same = results[False], results[True]
    assert copy.in_place is False and same.in_place is True
    assert copy.removed.equals(same.removed)
    pd.testing.assert_frame_equal(copy.metrics, same.metrics)
    pd.testing.assert_frame_equal(copy.parameters, same.parameters)
    assert same.max_logit_gap == copy.max_logit_gap < 1e-5
    assert set(same.timing["variant"]) == {"original", "masked", "pruned"}
    state = same.model.state_dict()
    for name, tensor in copy.model.state_dict().items():
        assert torch.equal(state[name], tensor), name
