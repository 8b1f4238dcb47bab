"""The training loop: AdamW, warm-up then cosine decay, clipping, seeded data, safe checkpoints.

Library code never prints: progress goes to the `progress` callback (the CLI renders it with rich),
metrics go to `metrics.csv` in the output directory as training runs.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.nn.parallel import DistributedDataParallel

from probe import provenance
from probe.checkpoint import save_checkpoint
from probe.checkpoint_files import CHECKPOINT_FILES, METRICS
from probe.config import ModelConfig
from probe.data.tasks import Batch, TaskConfig, sample_length, score, sequence_length
from probe.errors import Interrupted, ProbeError
from probe.files import claim_output, open_output
from probe.measure.evaluate import batch_loss, check_lengths, evaluate, form_for, forward_batch
from probe.measure.memory import check_forward, check_model
from probe.measure.observe import attention_stats
from probe.model import Transformer
from probe.runtime import resolve_device
from probe.train_config import Schedule, TrainConfig
from probe.training.distributed import (
    barrier,
    check_batch_size,
    global_batch,
    local_device,
    mean_over_ranks,
    process_group,
    rank_rows,
    rank_slice,
    shard_generators,
    world_from_env,
)

# per-head statistics logged every stats_every steps: entropy collapse and max-logit growth
MONITORED = ("entropy", "normalized_entropy", "max_logit", "p_max", "sink_mass")
METRIC_COLUMNS = ["step", "split", "length", "layer", "head", "metric", "value", "n"]


class TrainingDiverged(ProbeError):
    """The loss became NaN or infinite."""


@dataclass(frozen=True)
class TrainProgress:
    step: int
    steps: int
    loss: float
    accuracy: float  # exact match on the last training batch
    lr: float
    eval_exact: float | None = None  # mean exact match at the training lengths, when evaluated


@dataclass
class TrainResult:
    model: Transformer
    metrics: pd.DataFrame
    path: Path | None


def lr_at(step: int, cfg: TrainConfig, d_model: int) -> float:
    """The learning rate of (0-based) `step`: with the cosine schedule, linear warm-up to cfg.lr,
    then cosine decay to cfg.lr * cfg.lr_min_ratio; with the paper's (section 5.3),
    cfg.lr * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5) at step number t = step + 1."""
    if cfg.schedule == Schedule.PAPER:
        t = step + 1
        return cfg.lr * d_model**-0.5 * min(t**-0.5, t * cfg.warmup**-1.5)
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.lr_min_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def random_positions(
    batch: int, seq: int, max_len: int, generator: torch.Generator
) -> torch.Tensor:
    """Ruoss et al. 2023: per example, a sorted random subset of `seq` positions from
    [0, max_len)."""
    if seq > max_len:
        raise ProbeError(
            f"randomized positions need max_len >= sequence length ({seq}); raise --max-len."
        )
    noise = torch.rand(batch, max_len, generator=generator)  # [batch, max_len]
    return noise.argsort(dim=1)[:, :seq].sort(dim=1).values  # [batch, seq]


def _optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        positional = "table" in name or "score_bias" in name  # tables and learned score biases
        (decay if p.dim() >= 2 and not positional else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=cfg.adam_eps)


class MetricsLog:
    """Tidy metrics appended to a CSV as training goes (and kept in memory)."""

    def __init__(self, path: Path | None) -> None:
        self.rows: list[dict] = []
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(METRIC_COLUMNS)

    def add(self, rows: list[dict]) -> None:
        rows = [{c: r.get(c) for c in METRIC_COLUMNS} for r in rows]
        self.rows.extend(rows)
        if self.path is not None:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, METRIC_COLUMNS).writerows(rows)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=METRIC_COLUMNS)


def _positions_for(model: Transformer, batch: Batch, cfg: TrainConfig, gen: torch.Generator):
    if not cfg.random_positions:
        return None
    b, t = batch.inputs.shape
    return random_positions(b, t, model.cfg.max_len, gen).to(batch.inputs.device)


def check_training(model_cfg: ModelConfig, task: TaskConfig, train_cfg: TrainConfig,
                   shards: int = 1, new_model: bool = True) -> None:  # fmt: skip
    """What `train` refuses before any work: a global batch that does not split over `shards`,
    a vocabulary too small for the task and, for a `new_model`, one that does not fit in memory
    or whose positions cannot hold the longest training example. `probe train --nproc N` checks
    this before it starts the N processes."""
    check_batch_size(train_cfg.batch_size, shards)
    if model_cfg.vocab_size < task.vocab_size:
        raise ProbeError(
            f"the model's vocabulary ({model_cfg.vocab_size}) is smaller than task "
            f"'{task.name}' needs ({task.vocab_size})."
        )
    if not new_model:
        return
    hi = train_cfg.train_len[1]
    check_model(model_cfg, training=True)
    longest = sequence_length(task, form_for(model_cfg.arch), hi)
    check_forward(model_cfg, train_cfg.batch_size, longest, backward=True)
    with torch.device("meta"):  # the model's shape, no weights allocated
        check_lengths(Transformer(model_cfg), task, [hi])


def train(
    model_cfg: ModelConfig,
    task: TaskConfig,
    train_cfg: TrainConfig,
    out: str | Path | None = None,
    progress: Callable[[TrainProgress], None] | None = None,
    model: Transformer | None = None,
    overwrite: bool = False,
    shards: int | None = None,
) -> TrainResult:
    """Train a model on `task`; with `out`, write a checkpoint there (at each evaluation and at
    the end, only while the loss is finite) and metrics.csv as training goes.

    Under torchrun (WORLD_SIZE > 1) each process trains on its share of every global batch with
    DistributedDataParallel and only rank 0 writes (`probe.training.distributed`). `shards` splits
    each global batch into that many independently seeded sub-batches in one process: the update N
    processes compute (default: the number of processes, 1 alone)."""
    world = world_from_env()
    shards = shards or world.size
    if world.size > 1 and shards != world.size:
        raise ProbeError(f"shards ({shards}) must equal the number of processes ({world.size}).")
    check_training(model_cfg, task, train_cfg, shards, new_model=model is None)
    device = local_device(resolve_device(train_cfg.device), world)
    out = Path(out) if out is not None and world.main else None  # only rank 0 writes
    earlier = claim_output(out, CHECKPOINT_FILES, overwrite) if out is not None else []
    with process_group(world, device):
        return _train(model_cfg, task, train_cfg, out, earlier, progress, model, world, shards,
                      device)  # fmt: skip


def _train(model_cfg, task, train_cfg, out, earlier, progress, model, world, shards, device):
    """The loop of `train`, inside the process group (one process: none)."""
    lo, hi = train_cfg.train_len
    torch.manual_seed(train_cfg.seed)
    if model is None:
        model = Transformer(model_cfg)
    model.to(device).train()
    check_lengths(model, task, [hi])
    if out is not None:
        open_output(out, earlier)
    log = MetricsLog(out / METRICS if out is not None else None)
    meta = {"seed": train_cfg.seed, **provenance.context(device)}
    data_gen = torch.Generator().manual_seed(train_cfg.seed)
    pos_gen = torch.Generator().manual_seed(train_cfg.seed + 1)
    generators = shard_generators(train_cfg.seed, shards, data_gen)
    form = form_for(model_cfg.arch)
    optimizer = _optimizer(model, train_cfg)
    net = model
    if world.size > 1:
        ids = [device.index] if device.type == "cuda" else None
        net = DistributedDataParallel(model, device_ids=ids)
    autocast = device.type == "cuda"
    log_every = max(1, train_cfg.steps // 100)
    start = time.perf_counter()
    eval_exact = None

    saved = {"step": None}  # the step of the last good checkpoint written to `out`

    def kept() -> str:
        if out is None:
            return ""
        if saved["step"] is None:
            return f"; no checkpoint was written to {out} (none was good yet)"
        return f"; the last good checkpoint in {out} (step {saved['step']}) is kept"

    def evaluate_everywhere(step: int) -> float | None:
        """Rank 0 evaluates and saves; the others wait, and stop with it if it diverged."""
        failure, exact = None, None
        if world.main:
            try:
                exact = evaluate_and_save(step)
            except TrainingDiverged as exc:
                failure = exc
        if mean_over_ranks(float(failure is not None), world, device) > 0:
            raise failure or TrainingDiverged(
                f"rank 0 stopped at step {step}: the weights or "
                "the evaluation loss are no longer finite."
            )
        barrier(world)
        return exact

    def evaluate_and_save(step: int) -> float:
        table = evaluate(
            model, task, range(lo, hi + 1), batch_size=train_cfg.batch_size,
            n_batches=train_cfg.eval_batches, seed=10_000 + step, device=device,
        )  # fmt: skip
        log.add([{"step": step, "split": "eval", **r} for r in table.to_dict("records")])
        loss = table.loc[table.metric == "loss", "value"]
        finite = all(torch.isfinite(p).all() for p in model.parameters())
        if not finite or not np.isfinite(loss.to_numpy(dtype=float)).all():
            raise TrainingDiverged(
                f"at step {step} the weights or the evaluation loss are no longer finite"
                f"{kept()}. Lower --lr, raise --warmup, or try --qk-norm."
            )
        if out is not None:
            meta["steps_done"] = step
            meta["train_seconds"] = round(time.perf_counter() - start, 2)
            save_checkpoint(out, model, task, train_cfg, meta)
            saved["step"] = step
        exact = table[table.metric == "exact_match"]
        return float((exact.value * exact.n).sum() / exact.n.sum())

    step = 0
    try:
        for step in range(1, train_cfg.steps + 1):
            lr = lr_at(step - 1, train_cfg, model_cfg.d_model)
            for group in optimizer.param_groups:
                group["lr"] = lr
            n = sample_length(lo, hi, data_gen)
            batch = global_batch(task, form, n, train_cfg.batch_size, generators).to(device)
            positions = _positions_for(model, batch, train_cfg, pos_gen)
            if world.size > 1:  # this rank's share of the global batch
                if positions is not None:
                    positions = positions[rank_slice(batch.inputs.shape[0], world)]
                batch = rank_rows(batch, world)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                logits = forward_batch(net, batch, positions)  # [batch, seq, vocab]
            loss = batch_loss(
                model, batch, logits=logits, label_smoothing=train_cfg.label_smoothing
            )
            loss_value = mean_over_ranks(loss.item(), world, device)
            if not math.isfinite(loss_value):
                raise TrainingDiverged(
                    f"the loss became {loss_value} at step {step}{kept()}. Lower --lr, raise "
                    "--warmup, or try --qk-norm."
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            clip = train_cfg.grad_clip or float("inf")  # 0: measure the norm, clip nothing
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()

            last = step == train_cfg.steps
            if step % log_every == 0 or last or step == 1:
                exact, _ = score(logits.detach(), batch)
                accuracy = mean_over_ranks(exact.float().mean().item(), world, device)
                log.add([
                    {"step": step, "split": "train", "length": n, "metric": m, "value": v}
                    for m, v in (("loss", loss_value), ("exact_match", accuracy), ("lr", lr),
                                 ("grad_norm", float(grad_norm)))
                ])  # fmt: skip
            stats_now = train_cfg.stats_every and (step % train_cfg.stats_every == 0 or last)
            if stats_now and world.main:
                log.add(_attention_rows(model, batch, step))
            if (train_cfg.eval_every and step % train_cfg.eval_every == 0) or last:
                eval_exact = evaluate_everywhere(step)
                model.train()
            if progress is not None and world.main and (step % log_every == 0 or last):
                progress(TrainProgress(step, train_cfg.steps, loss_value, accuracy, lr, eval_exact))
    except (KeyboardInterrupt, Interrupted):
        raise Interrupted(f"training stopped at step {step} of {train_cfg.steps}{kept()}") from None
    model.eval()
    return TrainResult(model, log.frame(), out)


def _attention_rows(model: Transformer, batch: Batch, step: int) -> list[dict]:
    """Per-head attention statistics on one batch, for monitoring entropy collapse and max-logit
    growth during training (probe.measure.observe)."""
    was_training = model.training
    table = attention_stats(model, [batch], statistics=MONITORED)
    model.train(was_training)
    return [
        {"step": step, "split": "attention", "length": r.get("length"), "layer": r["layer"],
         "head": r["head"], "metric": r["statistic"], "value": r["value"]}
        for r in table.to_dict("records")
    ]  # fmt: skip
