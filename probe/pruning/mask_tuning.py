"""Kwon et al. 2022's mask tuning, layer by layer on the pruned model's own inputs (the procedure
is described in `probe.pruning.fisher`'s docstring, with the authors' code it follows).

Each site's least-squares problem is accumulated over tokens as normal equations: with A the
[token * d_model, kept (+1)] matrix of the kept heads' contributions (and a column of ones where a
constant is fitted) and y = x_t + attn_t(x_t) - x_s - b_O the target, G = A^T A and r = A^T y.
The student's inputs come from a forward pass of the model gated by the scales tuned so far,
stopped once the site has been seen; the teacher's targets from one pass of the unpruned model.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from probe.config import Norm
from probe.data.tasks import Batch
from probe.measure.batching import micro_batches
from probe.measure.evaluate import features_batch
from probe.model import Transformer
from probe.pruning.heads import check_heads, head_mask

RIDGE = 1e-6  # relative to the mean diagonal of each site's normal equations
MAX_SCALE = 10.0  # Kwon et al.'s code stops tuning when a scale leaves [-MAX_SCALE, MAX_SCALE]


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
    dtype = torch.float64 if only is not None else torch.float32
    seen: dict[int, SiteData] = {}

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.detach().reshape(-1, t.shape[-1]).to(dtype).cpu()

    def stream(layer: int):
        def keep(x: torch.Tensor) -> None:
            seen[layer] = SiteData(flat(x))

        return keep

    def heads(layer: int):
        def keep(merged: torch.Tensor) -> None:
            seen[layer].heads = flat(merged)
            raise _Stop

        return keep

    def output(layer: int):
        def keep(out: torch.Tensor) -> None:
            seen[layer].out = flat(out)

        return keep

    points = {}
    for attn in model.attention_modules():
        if only is not None and attn.layer != only:
            continue
        name = attn.site.name
        points[f"{name}.resid_pre"] = stream(attn.layer)  # the stream the sub-layer adds to
        if only is not None:
            points[f"{name}.heads"] = heads(attn.layer)
        else:
            points[f"{name}.out"] = output(attn.layer)
    before = [g.detach().clone() for g in model.gates()]
    was_training = model.training
    model.eval()
    result = []
    try:
        model.set_gates(gates)
        device = next(model.parameters()).device
        with model.intervene(points):
            for batch in batches:
                seen = {}
                with contextlib.suppress(_Stop):
                    features_batch(model, batch.to(device))
                result.append(seen)
    finally:
        model.set_gates(before)
        model.train(was_training)
    return result


def _constant(model: Transformer, attn: nn.Module) -> bool:
    """A constant joins the fit where the sub-layer's sum goes into a LayerNorm (post-LN)."""
    norm = _sublayers(model)[attn.layer][0]
    return model.cfg.norm == Norm.POST and isinstance(norm, nn.LayerNorm)


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


class _InStep:
    """One student pass over every batch at once, each batch's forward in its own thread, held
    at each tuned site until every batch has reached it: the site is then solved on all of
    them, and each batch goes on with the tuned scales. So every site is solved on the student's
    own inputs (the sites below it already tuned), as in the authors' loop over layers, for the
    cost of one forward pass (stopped after the last tuned site) instead of one per layer."""

    def __init__(self, model, batches, scales, remove, teacher, first):
        self.model, self.batches, self.scales = model, batches, scales
        self.teacher = teacher
        self.gates = [s.clone() for s in scales]  # the 0/1 mask the pass runs with
        mods = model.attention_modules()
        self.sites: dict[int, list[int]] = {}  # tuned site index -> its kept heads (local ids)
        for i, attn in enumerate(mods):
            keep = [j for j, h in enumerate(attn.kept_heads) if h not in remove.get(attn.layer, ())]
            if i > 0 and attn.layer >= first and keep:  # Kwon et al. skip the first layer
                self.sites[i] = keep
        self.mods = mods
        self.x: list[dict[int, torch.Tensor]] = [{} for _ in batches]
        self.heads: list[torch.Tensor | None] = [None] * len(batches)
        self.barrier = threading.Barrier(len(batches), action=self._solve)
        self.site = -1  # the site being solved
        self.stopped = False  # a scale left [-MAX_SCALE, MAX_SCALE]: later sites stay untuned

    def _solve(self) -> None:
        i, keep = self.site, self.sites[self.site]
        attn = self.mods[i]
        student = [SiteData(x.pop(attn.layer), h) for x, h in zip(self.x, self.heads, strict=True)]
        targets = [seen[attn.layer].double() for seen in self.teacher]
        gram, cross = normal_equations(attn, keep, student, targets, _constant(self.model, attn))
        solved = solve(gram, cross)[: len(keep)]
        if not torch.isfinite(solved).all() or solved.abs().max() > MAX_SCALE:
            self.stopped = True  # as the authors' code: this and every later site stay untuned
            return
        self.scales[i][torch.tensor(keep)] = solved

    def _stream(self, ident, layer: int):
        def keep(x: torch.Tensor) -> None:  # [batch, seq, d_model]
            self.x[ident.b][layer] = x.detach().reshape(-1, x.shape[-1]).double().cpu()

        return keep

    def _heads(self, ident, i: int, last: bool):
        def tune(merged: torch.Tensor) -> torch.Tensor:
            # merged [batch, q_len, n_kept * d_head], after the 0/1 gates
            self.heads[ident.b] = merged.detach().reshape(-1, merged.shape[-1]).double().cpu()
            self.site = i
            self.barrier.wait()
            if self.stopped or last:
                raise _Stop  # nothing after this site changes the scales
            gate = self.gates[i]
            ratio = torch.where(gate != 0, self.scales[i] / gate.where(gate != 0, 1.0), 0.0)
            per_column = ratio.repeat_interleave(self.mods[i].d_head)  # [n_kept * d_head]
            return merged * per_column.to(merged.dtype).to(merged.device)

        return tune

    def run(self) -> None:
        ident = threading.local()
        errors: list[BaseException] = []
        device = next(self.model.parameters()).device

        def work(b: int, batch: Batch) -> None:
            ident.b = b
            try:
                with torch.no_grad():  # grad mode is per thread
                    features_batch(self.model, batch.to(device))
            except (_Stop, threading.BrokenBarrierError):
                pass
            except BaseException as exc:  # re-raised in the calling thread
                errors.append(exc)
                self.barrier.abort()

        points = {}
        for i in self.sites:
            name, last = self.mods[i].site.name, i == max(self.sites)
            points[f"{name}.resid_pre"] = self._stream(ident, self.mods[i].layer)
            points[f"{name}.heads"] = self._heads(ident, i, last)
        with self.model.intervene(points):
            threads = [threading.Thread(target=work, args=(b, batch))
                       for b, batch in enumerate(self.batches)]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]


@torch.no_grad()
def tune_layer_by_layer(
    model: Transformer,
    removed: Sequence[tuple[int, int]],
    batches: Sequence[Batch],
    max_batch_tokens: int | None = None,
) -> list[torch.Tensor]:
    """Kwon et al.'s mask tuning: [head] scales per site, 0 for the removed heads. The batches
    run in micro-batches of `max_batch_tokens` tokens (the normal equations sum over tokens)."""
    remove = check_heads(model, removed)
    scales = [g.double().cpu() for g in head_mask(model, removed)]
    if not remove or not batches:
        return scales
    batches = list(micro_batches(batches, max_batch_tokens))
    # the unpruned model's x_t + attn_t(x_t) at every site (float32: all sites are held), one
    # micro-batch at a time so that x_t and attn_t(x_t) are never held apart for all of them
    teacher = []
    for batch in batches:
        (seen,) = site_pass(model, [batch])
        teacher.append({layer: d.x + d.out for layer, d in seen.items()})
    first = min(remove)  # below it the student is the teacher and the full mask is exact
    before = [g.detach().clone() for g in model.gates()]
    was_training = model.training
    model.eval()
    try:
        model.set_gates([s.to(g.dtype) for s, g in zip(scales, model.gates(), strict=True)])
        step = _InStep(model, list(batches), scales, remove, teacher, first)
        if step.sites:
            step.run()
    finally:
        model.set_gates(before)
        model.train(was_training)
    return scales
