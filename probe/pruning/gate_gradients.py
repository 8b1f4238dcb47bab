"""Per-example gradients of the loss with respect to every head's gate, for gradient (Michel et
al. 2019) and Fisher (Kwon et al. 2022) importance: one backward pass per micro-batch gives every
head at once (see `probe.pruning.estimators.gradients` for the derivation from the head outputs).

Only the gates require grad during the pass, so no weight gradient is computed; a micro-batch
whose backward pass would keep more than RECOMPUTE_ABOVE bytes of activations runs with its blocks
recomputed (`probe.measure.recompute`) instead of keeping them. Sums per head are float64 on the
CPU, the per-example products float32 (`probe.runtime.ACCUMULATE`), whatever the weights' dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch

from probe.data.tasks import Batch
from probe.measure.batching import row_tokens, split_batch
from probe.measure.evaluate import batch_loss
from probe.measure.recompute import recomputed_blocks
from probe.model import AttentionCall, Transformer
from probe.runtime import ACCUMULATE
from probe.training.distributed import active_world, sum_over_ranks

Progress = Callable[[int, int], None]  # (done, total)


class _HeadOutputs:
    """Keeps each site's head outputs ([batch, head, q, d_head], in the autograd graph) until
    `done`: a block that recomputes its forward during the backward pass calls it again, and
    keeping those calls' outputs would keep their whole graphs alive."""

    needs_weights = False

    def __init__(self) -> None:
        self.outputs: dict[int, torch.Tensor] = {}
        self.done = False

    def record(self, call: AttentionCall) -> None:
        if not self.done:
            self.outputs[call.layer] = call.head_out


@contextmanager
def _gates_in_graph(model: Transformer) -> Iterator[None]:
    """Within the block only the gates require grad: head outputs are in the graph, and the
    backward pass computes no weight gradients (nor keeps what they would need)."""
    params = list(model.parameters())
    before = [p.requires_grad for p in params]
    gates = {id(g) for g in model.gates()}
    try:
        for p in params:
            p.requires_grad_(id(p) in gates)
        yield
    finally:
        for p, flag in zip(params, before, strict=True):
            p.requires_grad_(flag)


def gate_gradients(model: Transformer, batches: Sequence[Batch], progress: Progress | None,
              power: int = 1, max_batch_tokens: int | None = None):  # fmt: skip
    """mean over examples of |dL(x)/dxi_h|^power for every head (power 2: diagonal Fisher),
    each batch in micro-batches of `max_batch_tokens` tokens (examples never interact, so a
    micro-batch's per-example gradients are the whole batch's)."""
    mods = model.attention_modules()
    totals = [torch.zeros(m.n_kept, dtype=torch.float64) for m in mods]
    n = 0
    world = active_world()  # data-parallel: each rank takes every world.size-th batch
    batches = batches[world.rank :: world.size]
    for step, batch in enumerate(batches):
        for part in split_batch(batch, max_batch_tokens):
            _add_gradients(model, part, power, totals)
            n += part.inputs.shape[0]
        if progress is not None:
            progress(step + 1, len(batches))
    *totals, count = sum_over_ranks(
        [*totals, torch.tensor([float(n)], dtype=torch.float64)], world
    )  # per-head sums and example counts over the ranks
    n = int(count.item())
    return [t / max(n, 1) for t in totals]


RECOMPUTE_ABOVE = 2**27  # bytes of activations a backward pass would keep (128 MiB) above which
# the blocks recompute them instead (`probe.measure.recompute`): below, the extra forward is not
# worth it


def _recompute(model: Transformer, batch: Batch) -> bool:
    """Whether a backward pass over `batch` would keep enough to be worth recomputing."""
    cfg = model.cfg
    size = next(model.parameters()).element_size()
    kept = cfg.n_sites * row_tokens(batch) * batch.inputs.shape[0] * (8 * cfg.d_model + cfg.d_ff)
    return kept * size > RECOMPUTE_ABOVE


def _add_gradients(model: Transformer, batch: Batch, power: int,
                   totals: list[torch.Tensor]) -> None:  # fmt: skip
    """Add sum over the examples of `batch` of |dL(x)/dxi_h|^power to totals[site] [head]. The
    backward pass runs inside the same blocks as the forward: a recomputing block runs its
    forward again then, and must find the same gates, observer and model."""
    observer = _HeadOutputs()
    recompute = recomputed_blocks(model) if _recompute(model, batch) else nullcontext()
    with torch.enable_grad(), _gates_in_graph(model), model.observe(observer), recompute:
        losses = batch_loss(model, batch, reduction="none")  # [batch]
        observer.done = True
        sites = [m for m in model.attention_modules() if m.n_kept > 0]
        outs = [observer.outputs[m.layer] for m in sites]  # [batch, head, q, d_head] each
        grads = torch.autograd.grad(losses.sum(), outs, allow_unused=True)
    for m, out, g in zip(sites, outs, grads, strict=True):
        if g is None:  # the loss does not depend on this site (e.g. a later cross-attention)
            continue
        gate = m.gate.detach().to(ACCUMULATE).view(1, -1)  # [1, head]
        xi_grad = (g.to(ACCUMULATE) * out.detach().to(ACCUMULATE)).sum(dim=(2, 3))  # [batch, head]
        safe = torch.where(gate != 0, gate, torch.ones_like(gate))  # xi_grad = xi * dL/dxi
        totals[m.layer] += (xi_grad / safe).abs().pow(power).sum(0).double().cpu()
