"""Fisher importance against a direct computation, mask tuning against the untuned mask on data it
did not fit, and folding the tuned scales into the weights."""

from __future__ import annotations

import torch

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.measure.evaluate import batch_loss, eval_batches
from probe.model import Transformer
from probe.pruning.fisher import fisher_prune, reconstruction_error, tune_masks
from probe.pruning.heads import head_mask
from probe.pruning.importance import head_importance

TASK = TaskConfig(n_symbols=8)


def model(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"vocab_size": TASK.vocab_size, "n_layer": 2, "n_head": 4, "d_model": 32,
                         **kw})  # fmt: skip
    m = Transformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3)
    return m.eval()


def data(seed: int):
    return eval_batches(TASK, "decoder", [5, 7], batch_size=6, n_batches=1, seed=seed)


def test_fisher_is_the_mean_squared_per_example_gate_gradient():
    m = model(n_kv_head=2)
    batches = data(0)
    table = head_importance(m, batches, "fisher").set_index(["layer", "head"])["value"]
    want = torch.zeros(2, 4, dtype=torch.float64)
    n = 0
    for batch in batches:  # one example at a time, autograd on the gates themselves
        for i in range(batch.inputs.shape[0]):
            one = batch.rows(torch.arange(batch.inputs.shape[0]) == i)
            gates = m.gates()
            for g in gates:
                g.requires_grad_(True)
            grads = torch.autograd.grad(batch_loss(m, one).sum(), gates)
            for g in gates:
                g.requires_grad_(False)
            want += torch.stack([g.double() for g in grads]) ** 2
            n += 1
    want /= n
    for layer in range(2):
        for head in range(4):
            assert abs(table[(layer, head)] - want[layer, head].item()) <= 1e-6 * (
                1 + want[layer, head].item()
            )


def test_one_pass_tuning_lowers_reconstruction_error_on_held_out_data():
    m = model()
    removed = [(0, 0), (0, 2), (1, 1), (1, 3)]
    scales = tune_masks(m, removed, data(0), procedure="one-pass")
    untuned = [g.double() for g in head_mask(m, removed)]
    fit, held = data(0), data(1)
    tuned_err = sum(reconstruction_error(m, held, scales))
    plain_err = sum(reconstruction_error(m, held, untuned))
    assert tuned_err < plain_err
    assert sum(reconstruction_error(m, fit, scales)) < sum(reconstruction_error(m, fit, untuned))
    for s, u in zip(scales, untuned, strict=True):
        assert torch.equal(s == 0, u == 0)  # removed heads stay removed


def test_reconstruction_error_is_the_sub_layer_output_gap():
    """The error computed from the Gram matrices equals || out(scaled) - out(all) ||^2 measured
    directly at the attention sub-layer (its bias cancels)."""
    m = model()
    batches = data(2)
    scales = [torch.tensor([0.5, 0.0, 1.5, 1.0], dtype=torch.float64), torch.ones(4).double()]
    got = reconstruction_error(m, batches, scales)
    outs = {}

    def hook(module, args, out):
        outs.setdefault(module.layer, []).append(out)

    handle = m.blocks[0].attn.register_forward_hook(hook)
    with torch.no_grad():
        for gates in (None, [s.float() for s in scales]):
            m.set_gates(gates)
            for b in batches:
                m(b.inputs)
    m.set_gates(None)
    handle.remove()
    n = len(batches)
    full, scaled = outs[0][:n], outs[0][n:]
    tokens = sum(b.inputs.numel() for b in batches)
    direct = sum(((s - f).double() ** 2).sum() for s, f in zip(scaled, full, strict=True)) / tokens
    assert abs(got[0] - float(direct)) < 1e-6 * (1 + float(direct))
    assert abs(got[1]) < 1e-9


def test_fisher_prune_folds_tuned_scales_into_the_weights():
    m = model(n_kv_head=2)
    result = fisher_prune(m, data(0), 0.5)
    pruned = result.model
    assert sum(len(s.kept_heads) for s in pruned.cfg.sites()) == 4
    assert all(bool((g == 1).all()) for g in pruned.gates())  # folded: gates back to 1
    x = data(3)[0].inputs
    before = [g.detach().clone() for g in m.gates()]
    m.set_gates([s.float() for s in result.scales])
    with torch.no_grad():
        want = m(x)  # the unpruned model with the tuned mask as gates
        got = pruned(x)
    m.set_gates(before)
    assert (got - want).abs().max() < 1e-5


def test_layer_importance_against_a_hand_run_residual_stream():
    import torch.nn.functional as F

    from probe.pruning.layer_drop import layer_importance, plan_layers

    for norm in ("pre", "post", "sandwich", "branch"):
        m = model(norm=norm, n_layer=3)
        batches = data(4)
        table = layer_importance(m, batches)
        want = torch.zeros(3, dtype=torch.float64)
        tokens = 0
        with torch.no_grad():
            for b in batches:
                pos = torch.arange(b.inputs.shape[1]).expand_as(b.inputs)
                x = m._embed(b.inputs, pos)
                for i, block in enumerate(m.blocks):
                    a = block.attn(block.ln_attn(x) if norm in ("pre", "sandwich") else x)
                    if norm in ("sandwich", "branch"):  # the norm on the branch's output
                        a = block.ln_attn_out(a)
                    cos = F.cosine_similarity(x.double(), (x + a).double(), dim=-1)
                    want[i] += (1 - cos).sum()
                    x = block(x, pos)
                tokens += b.inputs.numel()
        assert torch.allclose(torch.tensor(table.value.to_numpy()), want / tokens, atol=1e-9)
        drop = plan_layers(table, m, 1 / 3)
        lowest = int(table.sort_values("value").layer.iloc[0])
        assert drop == [(lowest, h) for h in range(4)]


def test_curve_points_of_tuned_fisher_and_layer_drop_match_direct_scoring():
    from probe.pruning.curves import pruning_curve, score_batches
    from probe.pruning.heads import plan_removal, present_heads
    from probe.pruning.importance import head_importance
    from probe.pruning.layer_drop import layer_importance, plan_layers

    m = model(n_layer=2)
    split, scoring = data(0), data(5)
    curve = pruning_curve(m, [split], scoring, ["fisher+tune", "attention-layer"], [0.0, 0.5])
    loss = curve[curve.metric == "loss"].set_index(["method", "fraction"])["value"]
    base = score_batches(m, scoring)["loss"]
    assert (
        abs(loss[("fisher+tune", 0.0)] - base) < 1e-6
    )  # the ridge term moves the scales of a full mask by ~1e-6
    plan = plan_removal(head_importance(m, split, "fisher"), present_heads(m), 4)
    scales = tune_masks(m, plan, split)
    m.set_gates([s.float() for s in scales])
    want = score_batches(m, scoring)["loss"]
    m.set_gates(None)
    assert abs(loss[("fisher+tune", 0.5)] - want) < 1e-6
    dropped = plan_layers(layer_importance(m, split), m, 0.5)
    m.set_gates(head_mask(m, dropped))
    want = score_batches(m, scoring)["loss"]
    m.set_gates(None)
    assert abs(loss[("attention-layer", 0.5)] - want) < 1e-6


def test_curve_by_key_value_group_matches_direct_scoring():
    from probe.pruning.curves import pruning_curve, score_batches
    from probe.pruning.groups import plan_units
    from probe.pruning.importance import head_importance

    m = model(n_kv_head=2)  # 2 layers x 2 groups of 2 heads
    split, scoring = data(0), data(5)
    curve = pruning_curve(m, [split], scoring, ["gradient"], [0.0, 0.5], unit="group")
    loss = curve[curve.metric == "loss"].set_index("fraction")
    plan = plan_units(head_importance(m, split, "gradient"), m, 0.5, "group", uniform=False)
    assert len(plan) == 4 and loss.loc[0.5, "n_pruned"] == 4  # 2 of 4 groups, 2 heads each
    m.set_gates(head_mask(m, plan))
    want = score_batches(m, scoring)["loss"]
    m.set_gates(None)
    assert abs(loss.loc[0.5, "value"] - want) < 1e-9
    assert abs(loss.loc[0.0, "value"] - score_batches(m, scoring)["loss"]) < 1e-9


def _hand_site(m, batches, site, gates):
    """By hand, block by block with `gates` set: per batch the residual x at `site`, the
    sub-layer's input, and the block (for running its attention)."""
    out = []
    m.set_gates(gates)
    with torch.no_grad():
        for b in batches:
            pos = torch.arange(b.inputs.shape[1]).expand_as(b.inputs)
            x = m._embed(b.inputs, pos)
            for i, block in enumerate(m.blocks):
                if i == site:
                    out.append((x, block.ln_attn(x) if m.cfg.norm_before else x, block))
                    break
                x = block(x, pos)
    m.set_gates(None)
    return out


def test_layer_by_layer_tuning_is_each_layers_least_squares_on_its_own_inputs():
    """Kwon et al.'s procedure: at each layer l >= 1 the scales are torch.linalg.lstsq of the
    unpruned layer's output (x_t + attn(x_t), on the unpruned inputs) minus the student's
    residual, on the heads' contributions computed one head at a time (the other gates 0) on the
    inputs of the model pruned and tuned below l; a constant column joins with post-LN. And the
    fit is never worse than the untuned mask on the same inputs."""
    for norm in ("pre", "post", "sandwich", "branch"):
        m = model(norm=norm, n_layer=3)
        batches = data(0)
        removed = [(0, 1), (1, 0), (1, 2), (2, 3)]
        scales = tune_masks(m, removed, batches)
        mask = [g.double() for g in head_mask(m, removed)]
        assert torch.equal(scales[0], mask[0])  # the first layer is not tuned (as their code)
        for s, u in zip(scales, mask, strict=True):
            assert torch.equal(s == 0, u == 0)
        for layer in (1, 2):
            gates = [s.float() for s in scales[:layer]] + [g.float() for g in mask[layer:]]
            student = _hand_site(m, batches, layer, gates)
            teacher = _hand_site(m, batches, layer, None)
            keep = [h for h in range(4) if (layer, h) not in removed]
            columns, ys = [], []
            for (xs, inp, block), (xt, inp_t, _) in zip(student, teacher, strict=True):
                with torch.no_grad():
                    target = xt + block.attn(inp_t)
                    bias = block.attn.o.bias
                    per_head = []
                    for h in keep:
                        one = torch.zeros(4)
                        one[h] = 1.0
                        block.attn.gate.copy_(one)
                        per_head.append((block.attn(inp) - bias).double().reshape(-1))
                    block.attn.gate.fill_(1.0)
                columns.append(torch.stack(per_head, 1))  # [token * d, kept]
                ys.append((target - xs - bias).double().reshape(-1))
            a, y = torch.cat(columns), torch.cat(ys)
            if norm == "post":  # LayerNorm after the sum: a constant shift is free
                a = torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype)], 1)
            want = torch.linalg.lstsq(a, y.unsqueeze(1)).solution.squeeze(1)[: len(keep)]
            got = scales[layer][keep]
            assert torch.allclose(got, want, atol=1e-4), (norm, layer, got, want)
            fitted = a[:, : len(keep)] @ got
            untuned = a[:, : len(keep)].sum(1)
            if norm == "pre":
                assert ((fitted - y) ** 2).sum() <= ((untuned - y) ** 2).sum()
        m.set_gates(None)


def test_one_pass_tuning_is_kept_as_a_named_variant():
    m = model()
    removed = [(0, 0), (1, 1)]
    one = tune_masks(m, removed, data(0), procedure="one-pass")
    layered = tune_masks(m, removed, data(0))
    assert not torch.allclose(one[1], layered[1])  # the second layer's inputs differ
    import pytest

    with pytest.raises(ValueError, match="layer-by-layer"):
        tune_masks(m, removed, data(0), procedure="twice")
