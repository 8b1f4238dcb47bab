"""Post-training pruning after Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for
Transformers"): a mask search driven by the diagonal Fisher information of the head mask, then
mask tuning, and the tuned mask folded into the weights.

- Search: F_h = mean over calibration examples of (dL(x)/dm_h)^2 (`head_importance(..., "fisher")`).
  Under the diagonal approximation the loss increase of removing a set S is about
  1/2 sum_{h in S} F_h, so the best mask under a budget of heads removes the lowest F_h. Every
  query head here costs the same parameters and FLOPs within a model (2 d_model d_head weights), so
  a budget in heads, parameters or FLOPs chooses the same heads (key/value heads go with the last
  query head that reads them). Kwon et al.'s block-diagonal mask rearrangement is not done.
- Tuning ("layer-by-layer", the default), as the authors' code does it (`rescale_mask` and
  `get_mha_lstsq` in github.com/WoosukKwon/retraining-free-pruning, prune/rescale.py): attention
  sites are tuned in order; for site l the student is the model pruned and already tuned below
  l, with site l's binary mask, run on the calibration data up to site l; the teacher is the
  unpruned model on the same data. The kept heads' scales m solve
      min_m || x_s + sum_{h kept} m_h c_h(x_s) + b_O - (x_t + attn_t(x_t)) ||^2   over tokens,
  with x_s, x_t the residual stream the sub-layer adds to in the student and in the teacher,
  c_h(x) = W_O[:, h] head_h(x) a head's contribution and attn_t the unpruned sub-layer's output:
  the pruned layer on its OWN inputs fits the unpruned layer's output on the unpruned inputs (the
  target of the authors' code, the attention output plus the residual before the norm). As
  there: the first site is not tuned (`layer_idx != 0`); tuning stops, leaving this and later
  sites untuned, when a scale leaves [-10, 10]; the solve is damped towards scales of 1 (their
  LSMR with damp=1 on the normal equations; here a ridge of RIDGE times the mean diagonal); a
  constant column joins the fit (their `torch.ones` column) only where the sub-layer's sum goes
  straight into a LayerNorm (post-LN, their BERT), which removes a constant shift; with pre-LN or
  RMSNorm a shift is not free, so no constant. Not done: their FFN-neuron rescaling (probe prunes
  heads only).
- Tuning "one-pass" (the variant probe used before): every site is solved from one forward pass
  of the unpruned model, fitting sum_{h kept} m_h c_h(x) to sum_h c_h(x) on the unpruned inputs;
  it ignores that the pruned model's own inputs to later layers differ.
- Folding: the scales move into W_O's columns (`Attention.fold_gates`), so the saved checkpoint
  computes the tuned function with gates of 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from probe.data.tasks import Batch
from probe.measure.batching import micro_batches
from probe.measure.evaluate import features_batch
from probe.model import AttentionCall, Transformer
from probe.pruning.heads import check_heads, head_mask, plan_removal, present_heads, prune_heads
from probe.pruning.heads import quota as head_quota
from probe.pruning.importance import head_importance
from probe.pruning.mask_tuning import RIDGE, tune_layer_by_layer

TUNINGS = ("layer-by-layer", "one-pass")


class _Contributions:
    """Observer accumulating, per site, G = C^T C and b = C^T t over tokens, with C the heads'
    contributions to the sub-layer output and t their sum (the unpruned output, bias aside)."""

    needs_weights = False

    def __init__(self, model: Transformer) -> None:
        self.mods = {m.layer: m for m in model.attention_modules()}
        self.gram: dict[int, torch.Tensor] = {}
        self.cross: dict[int, torch.Tensor] = {}
        self.tokens = 0

    def record(self, call: AttentionCall) -> None:
        m = self.mods[call.layer]
        out = call.head_out.detach().float()  # [batch, head, q, d_head]
        weight = m.o.weight.detach().float().view(m.o.out_features, m.n_kept, m.d_head)
        c = torch.einsum("bhqd,ehd->hbqe", out, weight)  # [head, batch, q, d_model]
        flat = c.reshape(m.n_kept, -1).double()  # [head, token * d_model]
        gram = flat @ flat.T  # [head, head]
        cross = gram.sum(1)  # [head]: c_h . sum_j c_j, the target being the sum of all heads
        self.gram[call.layer] = self.gram.get(call.layer, 0) + gram.cpu()
        self.cross[call.layer] = self.cross.get(call.layer, 0) + cross.cpu()


def reconstruction_error(model: Transformer, batches: Sequence[Batch], scales: list[torch.Tensor],
                         max_batch_tokens: int | None = None):  # fmt: skip
    """Per site, mean over tokens of || sum_h scales_h c_h - sum_h c_h ||^2 on `batches` (the
    unpruned model's activations): the quantity mask tuning minimises. scales: [head] per site,
    0 for removed heads."""
    observer = _Contributions(model)
    _collect(model, batches, observer, max_batch_tokens)
    errors = []
    for m, s in zip(model.attention_modules(), scales, strict=True):
        if m.layer not in observer.gram:
            errors.append(0.0)
            continue
        gram, cross = observer.gram[m.layer], observer.cross[m.layer]
        total = gram.sum()  # ||t||^2 summed over tokens
        s = s.double()
        err = s @ gram @ s - 2 * s @ cross + total
        errors.append(float(err) / max(observer.tokens, 1))
    return errors


@torch.no_grad()
def _collect(model: Transformer, batches: Sequence[Batch], observer: _Contributions,
             max_batch_tokens: int | None = None) -> None:  # fmt: skip
    """The unpruned model's head contributions summed over every token of `batches`, run in
    micro-batches of `max_batch_tokens` tokens."""
    before = [g.detach().clone() for g in model.gates()]
    was_training = model.training
    model.eval()
    try:
        model.set_gates(None)  # the unpruned model's activations
        device = next(model.parameters()).device
        with model.observe(observer):
            for batch in micro_batches(batches, max_batch_tokens):
                batch = batch.to(device)
                features_batch(model, batch)
                observer.tokens += batch.inputs.numel()
    finally:
        model.set_gates(before)
        model.train(was_training)


def tune_masks(
    model: Transformer,
    removed: Sequence[tuple[int, int]],
    batches: Sequence[Batch],
    procedure: str = "layer-by-layer",
    max_batch_tokens: int | None = None,
) -> list[torch.Tensor]:
    """Least-squares scales of the kept heads per site (0 for the removed ones): [head] each.
    `procedure`: "layer-by-layer" (Kwon et al.'s, the default) or "one-pass" (module docstring).
    The normal equations are sums over tokens, accumulated in micro-batches of
    `max_batch_tokens` tokens."""
    if procedure == "layer-by-layer":
        return tune_layer_by_layer(model, removed, batches, max_batch_tokens)
    if procedure != "one-pass":
        raise ValueError(f"procedure must be one of {', '.join(TUNINGS)}, got {procedure!r}")
    remove = check_heads(model, removed)
    observer = _Contributions(model)
    _collect(model, batches, observer, max_batch_tokens)
    scales = []
    for m in model.attention_modules():
        keep = [i for i, h in enumerate(m.kept_heads) if h not in remove.get(m.layer, ())]
        s = torch.zeros(m.n_kept, dtype=torch.float64)
        if keep and m.layer in observer.gram:
            idx = torch.tensor(keep)
            gram = observer.gram[m.layer][idx][:, idx]  # [kept, kept]
            ridge = RIDGE * gram.diagonal().mean().clamp_min(1e-30)
            solved = torch.linalg.solve(
                gram + ridge * torch.eye(len(keep)), observer.cross[m.layer][idx]
            )
            s[idx] = solved
        elif keep:
            s[torch.tensor(keep)] = 1.0
        scales.append(s)
    return scales


@dataclass
class FisherPruning:
    model: Transformer  # pruned, tuned scales folded into W_O
    removed: pd.DataFrame  # step, layer, head, method, value (Fisher information)
    scales: list[torch.Tensor]  # [head] per site of the original model: 0 removed, else tuned


def fisher_prune(
    model: Transformer,
    batches: Sequence[Batch],
    fraction: float,
    *,
    tune: bool = True,
    table: pd.DataFrame | None = None,
    progress=None,
    max_batch_tokens: int | None = None,
) -> FisherPruning:
    """Remove `fraction` of the heads present with the least Fisher information (global budget),
    tune the kept heads' scales on the same calibration `batches`, and fold them into the
    weights of a physically pruned copy. The input model is left unchanged. `table`: the Fisher
    importance already computed on `batches` (computed here when None). Both run in
    micro-batches of `max_batch_tokens` tokens."""
    if table is None:
        table = head_importance(model, batches, "fisher", progress=progress,
                                max_batch_tokens=max_batch_tokens)  # fmt: skip
    present = present_heads(model)
    chosen = plan_removal(table, present, head_quota(present, fraction, "global"))
    values = table.set_index(["layer", "head"])["value"]
    removed = pd.DataFrame(
        [{"step": 0, "layer": a, "head": b, "method": "fisher", "value": values[(a, b)]}
         for a, b in chosen],
        columns=["step", "layer", "head", "method", "value"],
    )  # fmt: skip
    masks = head_mask(model, chosen)
    scales = (tune_masks(model, chosen, batches, max_batch_tokens=max_batch_tokens) if tune
              else [g.double() for g in masks])  # fmt: skip
    before = [g.detach().clone() for g in model.gates()]
    try:
        model.set_gates([s.to(g.dtype) for s, g in zip(scales, before, strict=True)])
        pruned = prune_heads(model, chosen)
    finally:
        model.set_gates(before)
    for m in pruned.attention_modules():
        m.fold_gates()
    return FisherPruning(pruned, removed, scales)
