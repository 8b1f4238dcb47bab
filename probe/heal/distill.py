"""Distillation losses, summed over the rows given (the caller divides by the tokens of the
whole optimizer step):

- `kl_sum`: KL(teacher || student) of the next-token distributions at temperature T, times T^2
  (Hinton et al. 2015), as Minitron distills logits (Muralidharan et al. 2024). Computed
  LOSS_CHUNK logits at a time in float32, the student's chunk checkpointed: no
  [tokens x vocabulary] tensor of either model exists whole.
- `hidden_sum`: 1 - cos(student, teacher) of the residual stream after each block, averaged
  over the blocks (a pruned model keeps every block, so layer i matches layer i).

    ht = teacher.features(ids)                      # no gradient
    hs = student.features(ids)
    loss = kl_sum(student, teacher, hs[mask], ht[mask], temperature) / step_tokens
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from probe.measure.loss import LOSS_CHUNK
from probe.runtime import ACCUMULATE


def _kl_rows(student, teacher, hs: torch.Tensor, ht: torch.Tensor,
             temperature: float) -> torch.Tensor:  # fmt: skip
    """sum over rows of KL(p_t || p_s) * T^2; hs, ht [rows, d_model]."""
    with torch.no_grad():
        log_t = F.log_softmax(teacher.logits(ht).to(ACCUMULATE) / temperature, -1)  # [rows, vocab]
    log_s = F.log_softmax(student.logits(hs).to(ACCUMULATE) / temperature, -1)  # [rows, vocab]
    kl = F.kl_div(log_s, log_t, log_target=True, reduction="sum")
    return kl * temperature**2


def kl_sum(student, teacher, hs: torch.Tensor, ht: torch.Tensor, temperature: float = 1.0,
           chunk: int = LOSS_CHUNK) -> torch.Tensor:  # fmt: skip
    """KL(teacher || student) * T^2 summed over the rows: hs, ht [rows, d_model] are the two
    models' last hidden states at the same positions; a float32 scalar."""
    per = max(1, chunk // student.cfg.vocab_size)
    total = hs.new_zeros((), dtype=ACCUMULATE)
    for start in range(0, hs.shape[0], per):
        h_s, h_t = hs[start : start + per], ht[start : start + per]
        if torch.is_grad_enabled() and h_s.requires_grad:  # recompute this chunk's logits
            part = checkpoint(_kl_rows, student, teacher, h_s, h_t, temperature,
                              use_reentrant=False)  # fmt: skip
        else:
            part = _kl_rows(student, teacher, h_s, h_t, temperature)
        total = total + part
    return total


def hidden_sum(student_layers: list[torch.Tensor], teacher_layers: list[torch.Tensor],
               mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """sum over the scored positions of the mean over blocks of 1 - cos(student, teacher);
    layers [batch, seq, d_model] each, mask [batch, seq] bool; a float32 scalar."""
    total = None
    for s, t in zip(student_layers, teacher_layers, strict=True):
        cos = F.cosine_similarity(s[mask].to(ACCUMULATE), t[mask].to(ACCUMULATE), dim=-1)
        part = (1.0 - cos).sum()  # over [scored positions]
        total = part if total is None else total + part
    return total / len(student_layers)
