"""The parts of a block besides attention: the norms and the position-wise feed-forward; and
`sliced`, a linear layer cut to some rows or columns (pruning heads)."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from probe.config import FFN, ModelConfig, NormType


def sliced(layer: nn.Linear, index: list[int], dim: int) -> nn.Linear:
    """A copy of `layer` keeping rows (dim 0) or columns (dim 1) `index` of its weight."""
    idx = torch.tensor(index, dtype=torch.long, device=layer.weight.device)
    weight = layer.weight.detach().index_select(dim, idx)  # [out, in] sliced
    bias = layer.bias
    if bias is not None and dim == 0:
        bias = bias.detach().index_select(0, idx)
    with warnings.catch_warnings():  # a fully pruned site has zero-element weights
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")
        new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                        device=weight.device, dtype=weight.dtype)  # fmt: skip
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias.detach())
    new.weight.requires_grad_(layer.weight.requires_grad)
    return new


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * gain, normalised in float32 (Zhang & Sennrich 2019).

    The gain is `offset + weight` (Gemma stores w and scales by 1 + w). Half-precision models
    round in one of two orders: Llama rounds the normalised x to the weights' dtype and then
    multiplies; Gemma and OLMo-2 multiply in float32 and round once (`gain_float32`)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0, gain_float32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))  # a gain of 1
        self.eps, self.offset, self.gain_float32 = eps, offset, gain_float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # [..., dim]
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gain_float32 or self.offset:
            return (h * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)


def make_norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    """The config's norm (LayerNorm or RMSNorm) over `dim` features (default d_model)."""
    dim = cfg.d_model if dim is None else dim
    if cfg.norm_type == NormType.RMS:
        return RMSNorm(dim, cfg.ln_eps, cfg.norm_offset, cfg.norm_gain_float32)
    return nn.LayerNorm(dim, eps=cfg.ln_eps)


def activation(kind: FFN, h: torch.Tensor) -> torch.Tensor:
    """The FFN's nonlinearity (SwiGLU's gate uses SiLU, GeGLU's torch's tanh GELU)."""
    if kind == FFN.RELU:
        return F.relu(h)
    if kind == FFN.SWIGLU:
        return F.silu(h)
    if kind == FFN.GEGLU:  # Gemma's gelu_pytorch_tanh: the fused form in every dtype
        return F.gelu(h, approximate="tanh")
    if kind == FFN.GELU_TANH and h.dtype in HALF:
        return gelu_new(h)
    return F.gelu(h, approximate="tanh" if kind == FFN.GELU_TANH else "none")


HALF = (torch.bfloat16, torch.float16)


def gelu_new(h: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU written out, op by op in h's dtype, as transformers' `gelu_new` (and
    OpenAI's GPT-2) evaluates it. In float32 it equals torch's fused form to rounding; in bf16
    or fp16 each op rounds, so probe follows the same roundings to agree with transformers'
    half-precision GPT-2 (the fused form would round once: its top-1 next token differed from
    transformers' bf16 on 1.4% of the shipped text's positions)."""
    return (
        0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
    )


GATED = (FFN.SWIGLU, FFN.GEGLU)


class FeedForward(nn.Module):
    """Position-wise FFN: W2 act(W1 x), or gated (SwiGLU, GeGLU) W2 (act(W_gate x) * W1 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.ffn in GATED else None
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.kind = cfg.ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            h = activation(self.kind, self.gate(x)) * self.up(x)  # [batch, seq, d_ff]
        else:
            h = activation(self.kind, self.up(x))  # [batch, seq, d_ff]
        return self.down(h)  # [batch, seq, d_model]
