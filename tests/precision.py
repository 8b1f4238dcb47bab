"""What half precision may cost, for the tests that compare a bf16 or fp16 computation with a
float32 one.

A dtype's unit roundoff u is the largest relative error of rounding one number to it: 2^-8 for
bfloat16 (8 significant bits), 2^-11 for float16 (11), 2^-24 for float32. A forward pass of the
tiny models below rounds each activation once per elementary step (matmul, norm, softmax @ v,
residual add), some 20 steps in series for two blocks, and those errors add. So a half-precision
forward pass is bounded by `ROUNDINGS` x u x the largest logit of the same computation in
float32 on the same (rounded) weights. Measured over four seeds of every tiny variant the tests
build, the errors are 2.4u-8u of the largest logit, so the bound has a margin of 2 or more.

The bound catches what breaks outright in half precision (a dtype mixed up, an overflow to
inf, a mask that turns a row into NaN, a path that does not run); the losses that hide inside
rounding noise on 12-token inputs (frequencies or slopes rounded to bf16, which matter thousands
of positions in) are tested directly where they arise.
"""

from __future__ import annotations

import torch

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
ROUNDINGS = 16  # rounding steps in series a tiny model's forward pass may accumulate
HALF = [torch.bfloat16, torch.float16]


def bound(dtype: torch.dtype, scale: float | torch.Tensor) -> float:
    """The largest error a `dtype` forward pass of a tiny model may make on values of `scale`."""
    return ROUNDINGS * UNIT_ROUNDOFF[dtype] * float(scale)


def rounded(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` (float32) with every weight rounded to `dtype` and back, in place: the float32
    computation of exactly the weights a `dtype` copy holds."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    return model


def decided(reference: torch.Tensor, margin: float) -> torch.Tensor:
    """[...] bool: positions whose top logit leads the second by more than `margin` (rounding
    within `margin` cannot change their argmax)."""
    top2 = reference.float().topk(2, dim=-1).values  # [..., 2]
    return (top2[..., 0] - top2[..., 1]) > margin


def assert_matches_reference(
    ours: torch.Tensor,
    theirs: torch.Tensor,
    theirs32: torch.Tensor,
    keep: torch.Tensor | None = None,
    logits: bool = True,
) -> None:
    """probe's output `ours` in a half dtype against a reference library's `theirs` in the same
    dtype, given the reference's float32 output `theirs32` on the same weights (`keep`: the
    positions to compare, e.g. not padding).

    Bound: |ours - theirs| <= |ours - ours32| + |ours32 - theirs32| + |theirs32 - theirs|. The
    first and last terms are one dtype's rounding of the same computation, measured here on the
    reference as `noise` = max |theirs - theirs32|; the middle is float32 parity (1e-4). So the
    gap must be at most 2 x noise + 1e-4: probe may round differently, never worse than the
    reference rounds. The argmax must agree wherever the reference's top two logits are further
    apart than 2 x noise (further than its own rounding could close; the gap bound alone allows
    flips up to twice that), and those must be at least half the positions (so the check says
    something). `logits` False: hidden states, compared by the bound only."""
    if keep is not None:
        ours, theirs, theirs32 = ours[keep], theirs[keep], theirs32[keep]
    ours, theirs, theirs32 = ours.float(), theirs.float(), theirs32.float()
    noise = float((theirs - theirs32).abs().max())
    gap = float((ours - theirs).abs().max())
    limit = 2 * noise + 1e-4
    assert gap <= limit, f"gap {gap:.3g} > 2 x reference noise {noise:.3g} + 1e-4"
    if not logits:
        return
    sure = decided(theirs, 2 * noise)  # the reference's own rounding cannot flip these
    assert float(sure.float().mean()) >= 0.5, "too few positions have a clear top-1"
    assert torch.equal(ours.argmax(-1)[sure], theirs.argmax(-1)[sure])
