"""Kwon et al. 2022's mask tuning, layer by layer on the pruned model's own inputs (the procedure
is described in `probe.analysis.fisher`'s docstring, with the authors' code it follows).

Each site's least-squares problem is accumulated over tokens as normal equations: with A the
[token * d_model, kept (+1)] matrix of the kept heads' contributions (and a column of ones where a
constant is fitted) and y = x_t + attn_t(x_t) - x_s - b_O the target, G = A^T A and r = A^T y.
The student's inputs come from a forward pass of the model gated by the scales tuned so far,
stopped once the site has been seen; the teacher's targets from one pass of the unpruned model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from probe.analysis.fisher import MAX_SCALE, RIDGE
from probe.analysis.pruning import check_heads, head_mask
from probe.config import Norm
from probe.evaluate import forward_batch
from probe.model import Transformer
from probe.tasks import Batch


class _Stop(Exception):
    """Ends a student forward pass once the site being tuned has been seen."""


@dataclass
class SiteData:
    """One batch at one site: residual stream x [token, d_model], the heads' merged outputs
    (after the gates, before W_O) [token, n_kept * d_head], the sub-layer's output [token, d]."""

    x: torch.Tensor
    heads: torch.Tensor | None = None
    out: torch.Tensor | None = None


def _sublayers(model: Transformer) -> dict[int, tuple[nn.Module, nn.Module]]:
    blocks = list(model.encoder or []) + list(model.blocks)
    return {attn.layer: (norm, attn) for b in blocks for norm, attn in b.attention_sublayers()}


@torch.no_grad()
def site_pass(model: Transformer, batches: Sequence[Batch], only: int | None = None,
              gates: list[torch.Tensor] | None = None) -> list[dict[int, SiteData]]:  # fmt: skip
    """Per batch, {site: SiteData} of a forward pass with `gates` (None: all ones); with `only`,
    just that site (and the pass stops there once its heads are seen; `out` stays None); without,
    every site's x and out but not its heads (float32, to hold every site of the calibration
    data). The model's gates come back afterwards."""
    pre = model.cfg.norm == Norm.PRE
    dtype = torch.float64 if only is not None else torch.float32
    seen: dict[int, SiteData] = {}
    handles = []

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.detach().reshape(-1, t.shape[-1]).to(dtype).cpu()

    def stream(layer: int):
        def hook(module, args):
            seen[layer] = SiteData(flat(args[0]))

        return hook

    def heads(layer: int):
        def hook(module, args):
            seen[layer].heads = flat(args[0])
            if only is not None:
                raise _Stop

        return hook

    def output(layer: int):
        def hook(module, args, out):
            seen[layer].out = flat(out)

        return hook

    before = [g.detach().clone() for g in model.gates()]
    was_training = model.training
    model.eval()
    result = []
    try:
        model.set_gates(gates)
        for layer, (norm, attn) in _sublayers(model).items():
            if only is not None and layer != only:
                continue
            handles.append((norm if pre else attn).register_forward_pre_hook(stream(layer)))
            if only is not None:
                handles.append(attn.o.register_forward_pre_hook(heads(layer)))
            else:
                handles.append(attn.register_forward_hook(output(layer)))
        device = next(model.parameters()).device
        for batch in batches:
            seen = {}
            with contextlib.suppress(_Stop):
                forward_batch(model, batch.to(device))
            result.append(seen)
    finally:
        for h in handles:
            h.remove()
        model.set_gates(before)
        model.train(was_training)
    return result


def _constant(model: Transformer, attn: nn.Module) -> bool:
    """A constant joins the fit where the sub-layer's sum goes into a LayerNorm (post-LN)."""
    norm = _sublayers(model)[attn.layer][0]
    return model.cfg.norm != Norm.PRE and isinstance(norm, nn.LayerNorm)


def contributions(attn: nn.Module, heads: torch.Tensor) -> torch.Tensor:
    """[head, token, d_model]: W_O[:, h] head_h for every head of the site, from the merged head
    outputs [token, n_kept * d_head]."""
    weight = attn.o.weight.detach().double().cpu()  # [d_model, n_kept * d_head]
    w = weight.view(weight.shape[0], attn.n_kept, attn.d_head)  # [d_model, head, d_head]
    h = heads.view(heads.shape[0], attn.n_kept, attn.d_head)  # [token, head, d_head]
    return torch.einsum("thd,ehd->hte", h, w)  # [head, token, d_model]


def normal_equations(attn: nn.Module, keep: list[int], student: list[SiteData],
                     targets: list[torch.Tensor], constant: bool):  # fmt: skip
    """(G, r) of the site's least squares over all batches: A = [c_h for kept h (, 1)] and
    y = target - x_s - b_O, flattened over tokens and d_model."""
    n = len(keep) + constant
    gram = torch.zeros(n, n, dtype=torch.float64)
    cross = torch.zeros(n, dtype=torch.float64)
    bias = attn.o.bias.detach().double().cpu() if attn.o.bias is not None else 0.0
    for s, target in zip(student, targets, strict=True):
        c = contributions(attn, s.heads)[keep].reshape(len(keep), -1)  # [kept, token * d]
        y = (target - s.x - bias).reshape(-1)  # [token * d]
        if constant:
            c = torch.cat([c, torch.ones(1, c.shape[1], dtype=c.dtype)])
        gram += c @ c.T
        cross += c @ y
    return gram, cross


def solve(gram: torch.Tensor, cross: torch.Tensor) -> torch.Tensor:
    """The least-squares solution, damped towards 1 (as the authors' solver, which solves for
    the change from 1): (G + lambda I) d = r - G 1, m = 1 + d."""
    ones = torch.ones(len(cross), dtype=torch.float64)
    ridge = RIDGE * gram.diagonal().mean().clamp_min(1e-30)
    change = torch.linalg.solve(gram + ridge * torch.eye(len(cross)), cross - gram @ ones)
    return ones + change


def tune_layer_by_layer(
    model: Transformer, removed: Sequence[tuple[int, int]], batches: Sequence[Batch]
) -> list[torch.Tensor]:
    """Kwon et al.'s mask tuning: [head] scales per site, 0 for the removed heads."""
    remove = check_heads(model, removed)
    scales = [g.double().cpu() for g in head_mask(model, removed)]
    mods = model.attention_modules()
    if not remove:
        return scales
    # the unpruned model's x_t + attn_t(x_t) at every site (float32: all sites are held)
    teacher = [
        {layer: d.x + d.out for layer, d in seen.items()} for seen in site_pass(model, batches)
    ]
    first = min(remove)  # below it the student is the teacher and the full mask is exact
    for i, attn in enumerate(mods):
        keep = [j for j, h in enumerate(attn.kept_heads) if h not in remove.get(attn.layer, ())]
        if i == 0 or attn.layer < first or not keep:
            continue  # Kwon et al. skip the first layer and layers without heads
        gates = [s.to(g.dtype) for s, g in zip(scales, model.gates(), strict=True)]
        student = [seen[attn.layer] for seen in site_pass(model, batches, attn.layer, gates)]
        targets = [seen[attn.layer].double() for seen in teacher]
        gram, cross = normal_equations(attn, keep, student, targets, _constant(model, attn))
        solved = solve(gram, cross)[: len(keep)]
        if not torch.isfinite(solved).all() or solved.abs().max() > MAX_SCALE:
            break  # as the authors' code: this and every later site stay untuned
        scales[i][torch.tensor(keep)] = solved
    return scales
