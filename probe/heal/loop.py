"""`heal`: distill a pruned student from its unpruned teacher on real text, resumable.

The student trains on rows of `seq_len` tokens of the training text (shuffled by `seed`),
`batch_tokens` tokens per AdamW step, cut into micro-batches within the runtime's token budget
(gradients accumulate); the learning rate warms up linearly, then stays (`constant`) or decays
on a cosine to a tenth (`cosine`). Held-out perplexity is measured before (teacher and student)
and after chosen steps (always the last). Every few minutes, and at every evaluation, the
student, the optimizer and the rows measured so far are saved to `.probe-heal-state/` in the
output directory; `heal` called again on the same folder with the same settings resumes there,
with the same result as an uninterrupted run. The caller keeps other runs out of the folder
meanwhile (`probe.heal.state.holding`) and removes the state (`clear_state`) once it has
written its results.

    cfg = HealConfig(tokens=131072)
    result = heal(teacher, student, train_docs, heldout_docs, tokenizer, cfg, out)
    result.table            # stage, tokens, metric, value
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from probe.errors import Interrupted, ProbeError
from probe.heal.config import HealConfig  # re-exported: its home before
from probe.heal.distill import hidden_sum, kl_sum
from probe.heal.state import State
from probe.measure.batching import rows_per_pass
from probe.measure.loss import token_losses
from probe.model import Transformer
from probe.runtime import ACCUMULATE, Runtime

SAVE_SECONDS = 300.0  # at most this long between saves (and at every evaluation)


@dataclass(frozen=True)
class HealProgress:
    step: int  # optimizer steps done
    steps: int
    loss: float | None  # the last step's distillation loss per token
    lr: float
    note: str = ""  # what is happening now ("held-out perplexity", "saved")


@dataclass
class HealResult:
    table: pd.DataFrame  # stage (original, pruned, healed), tokens, metric, value
    losses: pd.DataFrame  # step, tokens, lr, kl, hidden
    resumed_at: int = 0  # the step a saved state resumed from (0: a fresh run)
    seconds: float = 0.0
    notes: dict = field(default_factory=dict)


def training_rows(docs: Sequence[str], tokenizer, cfg: HealConfig) -> torch.Tensor:
    """The rows the run trains on, in order: [steps x rows_per_step, seq_len] ids."""
    from probe.data.text import TextOptions, stream_rows

    ids, _ = stream_rows(docs, tokenizer, cfg.seq_len,
                         options=TextOptions(width="--seq-len"))  # fmt: skip
    wanted = cfg.steps * cfg.rows_per_step
    if ids.shape[0] < wanted:
        raise ProbeError(
            f"--tokens {cfg.tokens:,} needs {wanted:,} rows of {cfg.seq_len} tokens but the "
            f"training text holds {ids.shape[0]:,} ({ids.shape[0] * cfg.seq_len:,} tokens); ask "
            "for fewer tokens or give more text."
        )
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    return ids[order[:wanted]]


def heldout_rows(docs: Sequence[str], tokenizer, cfg: HealConfig) -> torch.Tensor:
    """The first eval_tokens // seq_len full rows of the held-out text: [rows, seq_len]."""
    from probe.data.text import TextOptions, stream_rows

    rows = cfg.eval_tokens // cfg.seq_len
    ids, _ = stream_rows(docs, tokenizer, cfg.seq_len, max_rows=rows,
                         options=TextOptions(text="--eval-text", width="--seq-len"))  # fmt: skip
    return ids


@torch.no_grad()
def perplexity(model: Transformer, rows: torch.Tensor, runtime: Runtime,
               max_batch_tokens: int | None) -> tuple[float, float]:  # fmt: skip
    """(mean next-token loss in nats, its exp) over rows [n, seq] of text."""
    total, count = 0.0, 0
    per = rows_per_pass(rows.shape[1], max_batch_tokens)
    for start in range(0, rows.shape[0], per):
        ids = rows[start : start + per].to(runtime.device)  # [batch, seq]
        with _autocast(runtime):
            hidden = model.features(ids)  # [batch, seq, d_model]
        losses = token_losses(model, hidden[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        total += float(losses.to(ACCUMULATE).sum())
        count += losses.numel()
    loss = total / count
    return loss, math.exp(loss)


def _autocast(runtime: Runtime):
    return torch.autocast(runtime.device.type, dtype=runtime.autocast_dtype,
                          enabled=runtime.autocast)  # fmt: skip


def optimizer_for(student: Transformer, cfg: HealConfig) -> torch.optim.AdamW:
    decay, flat = [], []
    for p in student.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else flat).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": flat, "weight_decay": 0.0}]  # fmt: skip
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def heal(
    teacher: Transformer,
    student: Transformer,
    train_docs: Sequence[str],
    heldout_docs: Sequence[str],
    tokenizer,
    cfg: HealConfig,
    out: Path,
    runtime: Runtime,
    *,
    max_batch_tokens: int | None = None,
    identity: dict | None = None,
    progress: Callable[[HealProgress], None] | None = None,
    restart: bool = False,
) -> HealResult:
    """Distill `student` (trained in place) from `teacher` (frozen); see the module's docstring.
    `identity` (the inputs' paths, ...) must match a saved state to resume from it; a state
    that cannot be resumed is refused in one line, or with `restart` (--overwrite) discarded."""
    started = time.perf_counter()
    report = progress or (lambda p: None)
    _check_trainable(student, cfg)
    teacher.eval().requires_grad_(False)
    student.eval()  # no dropout: healing is deterministic given the seed
    for p in student.parameters():
        p.requires_grad_(p.is_floating_point())
    for gate in student.gates():
        gate.requires_grad_(False)
    train = training_rows(train_docs, tokenizer, cfg)
    heldout = heldout_rows(heldout_docs, tokenizer, cfg)
    optimizer = optimizer_for(student, cfg)
    names = {id(p): n for n, p in student.named_parameters()}
    state = State(out, cfg.to_dict(), identity or {})
    rows, losses, step = state.restore(student, optimizer, names, discard=restart)
    resumed_at = step
    last_save = time.perf_counter()
    per_pass = rows_per_pass(cfg.seq_len, max_batch_tokens)
    saved = resumed_at  # the step the resume state holds (0: none)
    try:
        if step == 0:
            report(HealProgress(0, cfg.steps, None, 0.0, "held-out perplexity before"))
            for stage, model in (("original", teacher), ("pruned", student)):
                loss, ppl = perplexity(model, heldout, runtime, max_batch_tokens)
                rows += [_row(stage, 0, "loss", loss), _row(stage, 0, "perplexity", ppl)]
        while step < cfg.steps:
            lr = cfg.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = train[step * cfg.rows_per_step : (step + 1) * cfg.rows_per_step]
            kl_total, hidden_total = 0.0, 0.0
            for start in range(0, batch.shape[0], per_pass):
                ids = batch[start : start + per_pass].to(runtime.device)  # [micro, seq]
                kl, hid = _micro_step(teacher, student, ids, cfg, runtime)
                kl_total += kl
                hidden_total += hid
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            kl_mean = kl_total / cfg.step_tokens
            if not math.isfinite(kl_mean):
                raise ProbeError(f"healing diverged at step {step} (loss {kl_mean}); lower --lr.")
            losses.append({"step": step, "tokens": step * cfg.step_tokens, "lr": lr,
                           "kl": kl_mean, "hidden": hidden_total / cfg.step_tokens})  # fmt: skip
            report(HealProgress(step, cfg.steps, kl_mean, lr))
            evaluate = step in cfg.eval_steps
            if evaluate:
                report(HealProgress(step, cfg.steps, kl_mean, lr, "held-out perplexity"))
                loss, ppl = perplexity(student, heldout, runtime, max_batch_tokens)
                if not math.isfinite(loss):
                    raise ProbeError(f"healing diverged by step {step}: the held-out loss is "
                                     f"{loss}; lower --lr.")  # fmt: skip
                tokens = step * cfg.step_tokens
                rows += [_row("healed", tokens, "loss", loss),
                         _row("healed", tokens, "perplexity", ppl)]  # fmt: skip
            if step < cfg.steps and (evaluate or time.perf_counter() - last_save > SAVE_SECONDS):
                state.save(student, optimizer, names, rows, losses, step)
                last_save, saved = time.perf_counter(), step
    except Interrupted:  # Ctrl-C or SIGTERM (the CLI's handler): say what a rerun finds
        kept = (f"the resume state of step {saved} is kept in {state.folder}: the same "
                "command resumes there" if saved else "nothing was saved yet: the same "
                "command starts again")  # fmt: skip
        raise Interrupted(f"healing stopped at step {step} of {cfg.steps}; {kept}") from None
    if not all(bool(torch.isfinite(p).all()) for p in student.parameters()):
        raise ProbeError("healing diverged: the student's weights hold NaN or infinite values; "
                         "lower --lr.")  # fmt: skip
    notes = {"train_rows": int(train.shape[0]), "heldout_rows": int(heldout.shape[0]),
             "eval_tokens_measured": int(heldout.shape[0] * cfg.seq_len),
             "step_tokens": cfg.step_tokens}  # fmt: skip
    return HealResult(pd.DataFrame(rows), pd.DataFrame(losses), resumed_at,
                      time.perf_counter() - started, notes)  # fmt: skip


def _check_trainable(student: Transformer, cfg: HealConfig) -> None:
    dtype = next(student.parameters()).dtype
    if dtype == torch.float16:
        raise ProbeError("heal trains the student in float32 or bfloat16: float16 weights and "
                         "AdamW's moments underflow; use --dtype float32 or bfloat16.")  # fmt: skip
    limit = student.cfg.max_positions
    if limit is not None and cfg.seq_len > limit:
        raise ProbeError(f"--seq-len {cfg.seq_len} is longer than the model's {limit} "
                         "positions; use a shorter row.")  # fmt: skip


def _micro_step(teacher, student, ids: torch.Tensor, cfg: HealConfig,
                runtime: Runtime) -> tuple[float, float]:  # fmt: skip
    """Forward both models on ids [micro, seq], backward the student's share of the step's
    loss; returns the summed KL and hidden losses of these rows."""
    keep = cfg.hidden_weight > 0
    t_layers: list | None = [] if keep else None
    s_layers: list | None = [] if keep else None
    with torch.no_grad(), _autocast(runtime):
        ht = teacher.features(ids, collect=t_layers)  # [micro, seq, d_model]
    with _autocast(runtime):
        hs = student.features(ids, collect=s_layers)  # [micro, seq, d_model]
    kl = kl_sum(student, teacher, hs.flatten(0, 1), ht.flatten(0, 1), cfg.temperature)
    loss = kl
    hid = torch.zeros((), dtype=ACCUMULATE)
    if keep:
        mask = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)  # [micro, seq]
        hid = hidden_sum(s_layers, t_layers, mask)
        loss = loss + cfg.hidden_weight * hid
    (loss / cfg.step_tokens).backward()
    return float(kl.detach()), float(hid.detach())


def _row(stage: str, tokens: int, metric: str, value: float) -> dict:
    return {"stage": stage, "tokens": tokens, "metric": metric, "value": value}
