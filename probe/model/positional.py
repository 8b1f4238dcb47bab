"""Positional encodings, grouped by where they act.

- on the input: `InputPositions` (sinusoidal, learned, none) adds a vector per position;
- on q and k: `Rotary` rotates pairs of dimensions by a position-dependent angle;
- on the scores: `ALiBi`, `T5Bias` and `FIRE` share one interface,
  `bias(q_pos, k_pos) -> [batch, head, q, k]`, and name their per-head tensors in `PER_HEAD`
  (parameter name -> the dimension that indexes heads) so pruning can slice them.

Positions are integer tensors `[batch, seq]` (the plain `0..seq-1`, or a sorted random subset of a
larger range when training with randomized positions), so every encoding works at any length.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from probe.config import PE, ModelConfig
from probe.errors import ProbeError
from probe.rope import KINDS, RopeScaling


def sinusoidal_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The paper's encoding: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...)."""
    i = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)  # [d/2]
    inv_freq = torch.exp(-math.log(10000.0) * i / d_model)  # [d/2]
    angles = positions.float().unsqueeze(-1) * inv_freq  # [..., seq, d/2]
    table = torch.zeros(*positions.shape, d_model, device=positions.device)  # [..., seq, d]
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return table


class InputPositions(nn.Module):
    """Adds a positional vector to each token embedding (sinusoidal or learned), or nothing."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.pe
        self.d_model = cfg.d_model
        self.max_len = cfg.max_positions
        if self.kind == PE.LEARNED:
            self.table = nn.Embedding(cfg.max_len, cfg.d_model)

    @property
    def active(self) -> bool:
        return self.kind in (PE.SINUSOIDAL, PE.LEARNED)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [batch, seq] -> [batch, seq, d_model]."""
        if self.kind == PE.SINUSOIDAL:
            return sinusoidal_table(positions, self.d_model)
        if self.kind == PE.LEARNED:
            top = int(positions.max())
            if top >= self.max_len:
                raise ProbeError(
                    f"position {top} is beyond the learned table ({self.max_len} positions); "
                    f"a learned encoding cannot go past max_len={self.max_len}."
                )
            return self.table(positions)
        raise RuntimeError(f"{self.kind} adds nothing on the input")


class Rotary(nn.Module):
    """Rotary embedding on the first `rotary_dims` dimensions of each head (GPT-NeoX layout),
    with the frequencies and attention factor of its scaling kind (probe.rope.KINDS). The kinds
    whose frequencies depend on the length (dynamic, longrope) recompute them from each input's
    longest position, as transformers does within one forward."""

    def __init__(
        self, cfg: ModelConfig, base: float | None = None, scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        self.dims = cfg.rotary_dims
        self.base = cfg.rope_base if base is None else base
        self.scaling = cfg.rope_scaling if scaling is None else scaling
        self.float32 = cfg.rope_float32  # rotate in float32, round once (OLMo-2)
        inv_freq, self.attention = self._frequencies()
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [dims/2]

    def _frequencies(
        self, device: torch.device | None = None, length: int | None = None
    ) -> tuple[torch.Tensor, float]:
        """(inv_freq [dims/2], attention factor) at `length` (None: as loaded), computed as
        transformers computes them (on the default device, as it does) and moved to `device`."""
        inv_freq, attention = KINDS[self.scaling.kind](self.base, self.dims, self.scaling, length)
        return (inv_freq if device is None else inv_freq.to(device)), attention

    def _apply(self, fn, recurse: bool = True):
        """Moving or casting the model (`.to(bf16)`, `to_empty`) recomputes the frequencies on
        the new device in float32: rounded to bf16 they would turn positions past a few
        hundred into the wrong angles."""
        super()._apply(fn, recurse)
        self.inv_freq, _ = self._frequencies(self.inv_freq.device)  # [dims/2]
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [batch, head, seq, d_head], positions [batch, seq] -> rotated x, same shape."""
        inv_freq, attention = self.inv_freq, self.attention  # [dims/2]
        if self.scaling.by_length and positions.numel():
            inv_freq, attention = self._frequencies(x.device, int(positions.max()) + 1)
        angles = positions.float().unsqueeze(-1) * inv_freq  # [batch, seq, dims/2]
        dtype = torch.float32 if self.float32 else x.dtype  # where the products are rounded
        cos = (angles.cos() * attention).unsqueeze(1).to(dtype)  # [batch, 1, seq, dims/2]
        sin = (angles.sin() * attention).unsqueeze(1).to(dtype)  # [batch, 1, seq, dims/2]
        half = self.dims // 2
        x1, x2, rest = x[..., :half], x[..., half : self.dims], x[..., self.dims :]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([rotated, rest], dim=-1)


def rotary_changes(model: nn.Module, before: int, after: int) -> bool:
    """Whether any rotary of `model` turns positions by other frequencies at length `after`
    than at `before` (only the length-dependent kinds can): keys cached at `before` were then
    rotated by frequencies a forward at `after` would not use."""
    for module in model.modules():
        if isinstance(module, Rotary) and module.scaling.by_length:
            old, old_factor = module._frequencies(length=before)
            new, new_factor = module._frequencies(length=after)
            if old_factor != new_factor or not torch.equal(old, new):
                return True
    return False


class PerHead:
    """Mixin of the score biases: `prune(local)` keeps the heads at local indices `local` in
    every tensor named in `PER_HEAD` (parameter or buffer name -> the dimension of heads)."""

    PER_HEAD: ClassVar[dict[str, int]] = {}

    @torch.no_grad()
    def prune(self, local: list[int]) -> None:
        for name, dim in self.PER_HEAD.items():
            path, _, attr = name.rpartition(".")
            owner = self.get_submodule(path) if path else self
            tensor = getattr(owner, attr)
            idx = torch.tensor(local, dtype=torch.long, device=tensor.device)
            kept = tensor.detach().index_select(dim, idx)
            if isinstance(tensor, nn.Parameter):
                setattr(owner, attr, nn.Parameter(kept, requires_grad=tensor.requires_grad))
            else:
                owner.register_buffer(attr, kept)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Press et al.'s slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ...; for a head count
    that is not a power of two, those of the nearest lower power of two followed by every other
    slope of the next power of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_head & (n_head - 1) == 0:
        return torch.tensor(power_of_two(n_head))
    lower = 2 ** math.floor(math.log2(n_head))
    extra = power_of_two(2 * lower)[0::2][: n_head - lower]
    return torch.tensor(power_of_two(lower) + extra)


def relative_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """q_pos [batch, q], k_pos [batch, k] -> k - q as [batch, q, k]."""
    return k_pos.unsqueeze(1) - q_pos.unsqueeze(2)  # [batch, q, k]


class ALiBi(PerHead, nn.Module):
    """bias = -slope_h * |i - j|; slopes follow the heads' original ids, so pruning keeps them."""

    PER_HEAD: ClassVar[dict[str, int]] = {"slopes": 0}  # [head]

    def __init__(self, cfg: ModelConfig, heads: tuple[int, ...]) -> None:
        super().__init__()
        all_slopes = alibi_slopes(cfg.n_head)
        self.register_buffer("slopes", all_slopes[list(heads)].clone())  # [head] float32

    def _apply(self, fn, recurse: bool = True):
        """Casting the model (`.to(bf16)`) moves the slopes but keeps them float32: they are
        fixed by the head ids, and a rounded slope times a distance of thousands of keys is a
        wrong bias (as rotary keeps its frequencies float32)."""
        before = self.slopes
        super()._apply(fn, recurse)
        if self.slopes.dtype != before.dtype:
            self.slopes = before.to(device=self.slopes.device)  # [head]
        return self

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """[batch, head, q, k] float32 (the fused path casts it to the weights' dtype)."""
        dist = relative_distance(q_pos, k_pos).abs().float()  # [batch, q, k]
        return -self.slopes.float().view(1, -1, 1, 1) * dist.unsqueeze(1)  # [batch, head, q, k]


def t5_bucket(
    relative: torch.Tensor, bidirectional: bool, n_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucketing of k - q: exact buckets for small distances, log-spaced ones up to
    max_distance, one last bucket beyond; bidirectional models split the buckets by sign."""
    n = -relative  # positive when the key is before the query
    bucket = torch.zeros_like(n)
    if bidirectional:
        n_buckets //= 2
        bucket = bucket + (n < 0).long() * n_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    exact = max(n_buckets // 2, 1)
    log_ratio = torch.log(n.float().clamp(min=1) / exact) / math.log(max(max_distance / exact, 2))
    large = exact + (log_ratio * (n_buckets - exact)).long()
    large = large.clamp(max=n_buckets - 1)
    return bucket + torch.where(n < exact, n, large)


class T5Bias(PerHead, nn.Module):
    """A learned scalar per (bucket of relative position, head), added to the scores."""

    PER_HEAD: ClassVar[dict[str, int]] = {"table.weight": 1}  # [bucket, head]

    def __init__(self, cfg: ModelConfig, heads: tuple[int, ...]) -> None:
        super().__init__()
        self.bidirectional = not cfg.causal
        self.n_buckets = cfg.t5_buckets
        self.max_distance = cfg.t5_max_distance
        self.table = nn.Embedding(cfg.t5_buckets, len(heads))  # [bucket, head]

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        buckets = t5_bucket(
            relative_distance(q_pos, k_pos), self.bidirectional, self.n_buckets, self.max_distance
        )  # [batch, q, k]
        return self.table(buckets).permute(0, 3, 1, 2)  # [batch, head, q, k]


# FIRE's settings, as in the paper's code (Li et al. 2023, appendix): MLP width, initial c and L
FIRE_WIDTH = 32
FIRE_INIT_C = 0.1
FIRE_INIT_L = 512.0
FIRE_EPS = 1e-6


def _batch_invariant(pos: torch.Tensor) -> bool:
    """True when every row of `pos` [batch, seq] is the same view (positions expanded)."""
    return pos.shape[0] == 1 or pos.stride(0) == 0


class FIRE(PerHead, nn.Module):
    """Functional interpolation for relative positions (Li et al. 2023):

        bias_h(i, j) = f_h( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

    with f a small MLP (1 -> FIRE_WIDTH -> heads, ReLU) shared by the heads of a site, and c, L
    learned scalars (used as |c|, |L|). Dividing by psi(max(L, i)) maps every distance a query
    can see into [0, 1], so a longer input interpolates instead of extrapolating. A bidirectional
    model uses |i - j|; in a causal one the keys after i are masked anyway."""

    PER_HEAD: ClassVar[dict[str, int]] = {
        "out.weight": 0,
        "out.bias": 0,
    }  # the MLP's last layer: one output per head

    def __init__(self, cfg: ModelConfig, heads: tuple[int, ...]) -> None:
        super().__init__()
        self.hidden = nn.Linear(1, FIRE_WIDTH)
        self.out = nn.Linear(FIRE_WIDTH, len(heads))
        self.c = nn.Parameter(torch.tensor(FIRE_INIT_C))
        self.L = nn.Parameter(torch.tensor(FIRE_INIT_L))

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        if _batch_invariant(q_pos) and _batch_invariant(k_pos):  # compute one row, share it
            return self._bias(q_pos[:1], k_pos[:1]).expand(q_pos.shape[0], -1, -1, -1)
        return self._bias(q_pos, k_pos)

    def _bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """[batch, head, q, k] float32 whatever the weights' dtype: the normalized distances of
        neighbouring keys differ by less than bf16 resolves, so the small MLP runs in float32."""
        c = self.c.float().abs()
        distance = relative_distance(q_pos, k_pos).abs().float()  # |i - j| [batch, q, k]
        reach = torch.maximum(q_pos.float(), self.L.float().abs())  # max(L, i) [batch, q]
        scaled = torch.log1p(c * distance) / (torch.log1p(c * reach) + FIRE_EPS).unsqueeze(-1)
        hidden = F.relu(_linear32(self.hidden, scaled.unsqueeze(-1)))  # [batch, q, k, width]
        return _linear32(self.out, hidden).permute(0, 3, 1, 2)  # [batch, head, q, k]


def _linear32(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` computed in float32 (its weights upcast; x is float32)."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x, layer.weight.float(), bias)
