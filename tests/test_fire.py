"""FIRE (Li et al. 2023) against a direct, scalar implementation of its formula."""

import math

import pytest
import torch

from probe.config import ModelConfig
from probe.model import Transformer
from probe.pruning.heads import prune_heads


def fire_by_hand(module, i: int, j: int, head: int) -> float:
    """b_h(i, j) = f_h(psi(|i - j|) / psi(max(L, i))), psi(x) = log(c x + 1), f = W2 relu(W1 x + b1)
    + b2, one scalar at a time with Python floats."""
    c, big_l = abs(module.c.item()), abs(module.L.item())

    def psi(x: float) -> float:
        return math.log(c * x + 1.0)

    x = psi(abs(i - j)) / (psi(max(big_l, i)) + 1e-6)
    w1, b1 = module.hidden.weight[:, 0].tolist(), module.hidden.bias.tolist()
    w2, b2 = module.out.weight[head].tolist(), module.out.bias[head].item()
    return sum(w * max(0.0, a * x + b) for w, a, b in zip(w2, w1, b1, strict=True)) + b2


def fire_module(arch="decoder", n_head=3, **kw):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, pe="fire", n_head=n_head, d_model=24, **kw))
    module = model.attention_modules()[0].score_bias
    with torch.no_grad():  # weights far from the tiny init, and L within the tested positions
        for p in (module.hidden.weight, module.hidden.bias, module.out.weight, module.out.bias):
            p.normal_(0, 1.0)
        module.c.fill_(-0.7)  # used as |c|
        module.L.fill_(5.0)
    return model, module


@pytest.mark.parametrize("offset", [0, 3])
def test_fire_bias_matches_the_formula(offset):
    _, module = fire_module()
    q_pos = (torch.arange(9) + offset).unsqueeze(0)  # [1, 9], past L = 5 for the last ones
    bias = module.bias(q_pos, q_pos)  # [1, head, 9, 9]
    assert bias.shape == (1, 3, 9, 9)
    for h in range(3):
        for a in range(9):
            for b in range(9):
                i, j = a + offset, b + offset
                assert bias[0, h, a, b].item() == pytest.approx(
                    fire_by_hand(module, i, j, h), abs=1e-5
                )


def test_fire_interpolates_distances_to_the_unit_interval():
    # below L the normalizer is psi(L); beyond it psi(i): the largest distance a query sees,
    # i (to key 0), maps to at most 1 at every length
    _, module = fire_module()
    pos = torch.arange(200)
    c, big_l = abs(module.c.item()), abs(module.L.item())
    normalized = [math.log1p(c * i) / math.log1p(c * max(big_l, i)) for i in range(200)]
    assert max(normalized) <= 1.0 + 1e-9
    # shared positions across the batch are computed once and give the same rows as per-example
    shared = module.bias(pos[None].expand(2, -1), pos[None].expand(2, -1))
    separate = module.bias(pos[None].repeat(2, 1), pos[None].repeat(2, 1))
    torch.testing.assert_close(shared, separate)


def test_fire_is_pruned_per_head_and_learned():
    model, module = fire_module(n_head=4)
    pruned = prune_heads(model, [(0, 1), (0, 2)])
    kept = pruned.attention_modules()[0].score_bias
    pos = torch.arange(7).unsqueeze(0)
    torch.testing.assert_close(kept.bias(pos, pos), module.bias(pos, pos)[:, [0, 3]])
    model.train()
    tokens = torch.randint(0, 32, (2, 7))
    model(tokens).sum().backward()
    assert module.c.grad is not None and module.out.weight.grad.abs().sum() > 0
