"""Row sums of short attention calls from their full logits, worked in place.

The materialized path of `probe.measure.streaming` (inputs up to STREAM_ABOVE keys): the logits
of a few examples at a time (about CHUNK_ELEMENTS of them, so the passes over them stay in cache)
and, for causal self-attention, of a block of QUERY_BLOCK queries with only the keys those queries
can see (a causal call of n queries in blocks of 64 computes about half of the n x n logits at
n = 512). Written for few passes over memory, since observation should cost little more than the
fused attention it replaces:

- one buffer of raw q.k per chunk is worked in place (masks multiplied and added rather than
  filled); the raw statistics are read off it, and the logits' too when there is no bias (they
  are raw x factor);
- the logits are kept in units of log 2 (factor and log2 e applied in the pass that hides keys),
  so the softmax is exp2 of their difference from the maximum (torch's exp2 is several times
  faster than its exp on the CPU), and l = sum exp(s - m) is read off on the way: p_max = 1 / l
  needs no second maximum;
- short rows are padded with hidden keys (see `width_for`): torch's CPU row maximum runs
  vectorized only on whole steps of 32 floats;
- q, k and v, which arrive as views of one projection, are copied per chunk to row-major matrices.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from probe.measure.rowsums import RowSums, key_gap, row_factor, visible_count
from probe.model.call import AttentionCall

CHUNK_ELEMENTS = 2**18  # logits per group of examples
QUERY_BLOCK = 64  # queries per block of a causal self-attention call (see the module docstring)
ROW_STEP = 32  # floats per vectorized step of torch's CPU row maximum (see width_for)
LOG2E = 1.4426950408889634  # exp(x) = exp2(x log2 e)


def width_for(k_len: int) -> int:
    """Keys per materialized row: k_len, or k_len padded with hidden keys to 32 (up to 32 keys)
    or 64 (41 to 63 keys). torch's CPU row maximum runs vectorized in steps of ROW_STEP floats
    and takes about ten times as long per element on a row's remainder, which outweighs the
    padding there."""
    if k_len <= ROW_STEP:
        return ROW_STEP
    if 40 < k_len < 2 * ROW_STEP:
        return 2 * ROW_STEP
    return k_len


def _masks(visible: torch.Tensor | None, k_len: int, width: int, device):
    """(seen, hide): [batch|1, 1, q|1, width] float, 1/0 and 0/-inf by key visibility, the
    padding keys beyond k_len hidden; (None, None) when every key is seen."""
    if visible is None and width == k_len:
        return None, None
    if visible is None:
        visible = torch.ones(1, 1, 1, k_len, dtype=torch.bool, device=device)
    if width > k_len:
        visible = F.pad(visible, (0, width - k_len), value=False)
    seen = visible.float()
    return seen, torch.zeros_like(seen).masked_fill_(~visible, float("-inf"))


def _batched(x: torch.Tensor) -> torch.Tensor:
    """x [chunk, head, n, d_head] as a batch of row-major matrices (itself when it is one): q, k
    and v arrive as views of one projection, and a product with such a view of k transposed
    gathers it element by element."""
    if x.stride(-1) == 1 and x.stride(0) == x.shape[1] * x.stride(1):
        return x
    return x.contiguous()


def _moments(x: torch.Tensor, seen: torch.Tensor | None, n: torch.Tensor):
    """(mean, variance) of x's visible entries per row; zeroes the hidden ones in place."""
    if seen is not None:
        x.mul_(seen)  # [chunk, head, q, width]
    mean = x.sum(-1) / n
    square = torch.linalg.vector_norm(x, dim=-1).square_()
    return mean, square.div_(n).sub_(mean.square()).clamp_min_(0.0)


def _blocks(call: AttentionCall) -> list[tuple[int, int, int]]:
    """(first query, last query + 1, keys seen) per block of queries: for causal self-attention
    (query i sees no key after position k_len - q_len + i) about QUERY_BLOCK queries each, else
    one block."""
    q_len, k_len = call.q.shape[2], call.k.shape[2]
    causal = call.site.causal and not call.site.cross and call.visible is not None
    n = max(1, round(q_len / QUERY_BLOCK)) if causal else 1
    cuts = [i * q_len // n for i in range(n + 1)]
    return [(a, z, k_len - q_len + z) for a, z in itertools.pairwise(cuts)]


def _rows(q, f, k, k_len, v, bias, seen, hide, gap, n, need, divide, blind, cap=None):
    """Row sums of one chunk: q [chunk, head, q, d], f [1, head, q|1, 1] the factor on q.k, k
    [chunk, head, width, d] (zero rows for the padding keys beyond k_len), v [chunk, head,
    k_len, d] or None, bias [chunk, head, q, k_len] or None; `seen` is None when the only hidden
    keys are padding (whose logits are exactly 0), `divide` says whether every factor is
    positive, `blind` whether a row may see no key at all, and `cap` the soft-cap of the
    scaled logits (None: none). Without a bias or a cap the logits are raw x factor."""
    plain = bias is None and cap is None
    part: dict[str, torch.Tensor] = {}
    fr = f.squeeze(-1)  # [1, head, q|1]
    s = q @ k.transpose(-2, -1)  # [chunk, head, q, width]: raw q.k, 0 on padding keys
    if "raw" in need or ("logit" in need and plain):
        mean, var = _moments(s, seen, n)  # 0 where hidden from here on
        if "raw" in need:
            part["raw_mean"], part["raw_var"] = mean, var
        if "logit" in need and plain:  # the logits are raw x factor
            part["logit_mean"], part["logit_var"] = mean * fr, var * fr.square()
    softmax = "softmax" in need
    if "raw" in need and not (softmax and divide and plain):  # else from max_logit
        part["raw_max"] = (s if hide is None else s + hide).amax(-1)
    if not plain and ("logit" in need or softmax):
        s.mul_(f)  # scores: scaled, soft-capped, plus the bias
        if cap is not None:
            s.div_(cap).tanh_().mul_(cap)
        if bias is not None:
            s[..., :k_len].add_(bias)
        if "logit" in need:
            part["logit_mean"], part["logit_var"] = _moments(s, seen, n)
    if not softmax:
        return part
    # logits x log2(e), so that exp(s - m) is exp2 of the difference
    scale = f * LOG2E if plain else LOG2E
    e = s * scale if hide is None else torch.addcmul(hide, s, torch.as_tensor(scale))
    m2 = e.amax(-1)  # [chunk, head, q]
    part["m"] = m = m2 / LOG2E
    if "raw" in need and "raw_max" not in part:
        part["raw_max"] = m / fr
    part["sink"] = e[..., 0] / LOG2E
    e.sub_(m2.clamp_min(torch.finfo(torch.float32).min).unsqueeze(-1)).exp2_()  # exp(s - m)
    part["lsum"] = lsum = e.sum(-1)  # [chunk, head, q]
    inv = lsum.reciprocal()
    if blind:  # a row that sees nothing: 0
        inv = torch.where(lsum > 0, inv, 0.0)
    p = e.mul_(inv.unsqueeze(-1))  # softmax, 0 where hidden and on blind rows
    mean_s = s.mul_(p).sum(-1)  # sum_j p_j s_j: of the scores, or of raw q.k without a bias
    part["u"] = lsum * ((mean_s * fr if plain else mean_s) - m)  # sum e (s - m)
    if gap is not None:
        part["dist"] = lsum * torch.mul(p, gap, out=s).sum(-1)
    if v is not None:  # the attention output itself, from the same weights
        part["out"] = p[..., :k_len].to(v.dtype) @ v  # [chunk, head, q, d_head]
    return part


def materialized_rows(
    call: AttentionCall, need: set[str], output: bool = False
) -> tuple[RowSums, torch.Tensor | None]:
    """Row sums of `call` from its full logits, and with `output` (when the statistics need the
    softmax) the attention output softmax(logits) @ v from the same weights, else None."""
    b, h, q_len, _ = call.q.shape
    k_len = call.k.shape[2]
    factor = row_factor(call)  # [1, head, q|1, 1]
    count = visible_count(call, 0, k_len)
    divide = "raw" in need and bool((factor > 0).all())  # raw max = max logit / factor
    output = output and "softmax" in need
    blind = call.visible is not None and bool((count == 0).any())  # rows that see no key
    blocks = _blocks(call)
    q_all, k_all = call.q.float(), call.k.float()  # [batch, head, q_len|k_len, d_head]
    single = len(blocks) == 1 and b * h * q_len * width_for(k_len) <= CHUNK_ELEMENTS
    rows: dict[str, torch.Tensor] = {}
    for q0, q1, keys in blocks:
        width = width_for(keys)
        visible = call.visible
        if visible is not None:
            visible = visible[..., q0:q1, :keys] if visible.shape[2] > 1 else visible[..., :keys]
        seen, hide = _masks(visible, keys, width, call.q.device)  # [b|1, 1, q|1, width]
        gap = None
        if "distance" in need:
            gap = F.pad(key_gap(call, 0, keys)[q0:q1], (0, width - keys))  # [q, width]
        f = factor[:, :, q0:q1] if factor.shape[2] > 1 else factor
        size = max(1, CHUNK_ELEMENTS // max(1, h * (q1 - q0) * width))
        for lo in range(0, b, size):
            sl = slice(lo, lo + size)
            n = count[sl, :, q0:q1].clamp_min(1)
            mask = None if seen is None else seen[sl] if seen.shape[0] > 1 else seen
            plus = None if hide is None else hide[sl] if hide.shape[0] > 1 else hide
            q = _batched(q_all[sl, :, q0:q1])  # [chunk, head, q, d_head]
            k = k_all[sl, :, :keys]  # [chunk, head, keys, d_head]
            k = F.pad(k, (0, 0, 0, width - keys)) if width > keys else _batched(k)
            bias = None if call.bias is None else call.bias[sl, :, q0:q1, :keys]
            v = _batched(call.v[sl, :, :keys]) if output else None
            zeros = None if call.visible is None else mask  # padding logits are 0 already
            part = _rows(
                q, f, k, keys, v, bias, zeros, plus, gap, n, need, divide, blind, call.softcap
            )
            if single:
                rows = part
                continue
            for name, value in part.items():  # into [batch, head, q_len(, d_head)]
                if name not in rows:
                    rows[name] = value.new_empty((b, h, q_len, *value.shape[3:]))
                rows[name][sl, :, q0:q1] = value
    out = rows.pop("out", None)
    return RowSums(count=count, **rows), out
