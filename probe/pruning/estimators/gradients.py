"""gradient and fisher: how sensitive the loss is to each head's gate.

- gradient (Michel et al. 2019): I_h = mean over examples of |dL(x)/dxi_h|, xi_h the head's gate.
  The absolute value is taken per example; one backward pass per batch gives every head at once.
  Per-example gate gradients come from the head outputs: head_out = xi_h * out_h, so
  dL(x)/dxi_h = sum over positions and dims of dL(x)/dhead_out[x, h] * head_out[x, h] / xi_h, and
  since examples never interact, the gradient of the summed loss w.r.t. head_out[x] is example x's
  own. Nothing accumulates between batches (torch.autograd.grad, no .grad buffers).
- fisher (Kwon et al. 2022): I_h = mean over examples of (dL(x)/dxi_h)^2, the diagonal of the
  empirical Fisher information of the head mask; the same per-example gradients as above.

Both are sums over examples, so they run data-parallel (`probe.pruning.gate_gradients`).
"""

from __future__ import annotations

from functools import partial

from probe.pruning.estimators import Estimator, Given


def _gate_gradients(model, batches, given: Given, *, power: int):
    from probe.pruning.gate_gradients import gate_gradients

    return gate_gradients(model, batches, given.progress, power, given.max_batch_tokens)


DECLARES = (
    Estimator("gradient", "gradient |dL/dξ| (Michel et al.)",
              "|dL/dξ| of the head's gate, Michel et al. 2019",
              partial(_gate_gradients, power=1), order=10, data_parallel=True, gradients=True),
    Estimator("fisher", "Fisher (dL/dξ)² (Kwon et al.)",
              "dL/dξ squared, Kwon et al. 2022",
              partial(_gate_gradients, power=2), order=20, data_parallel=True, gradients=True),
)  # fmt: skip
