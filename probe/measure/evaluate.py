"""Running a model on task batches: loss, metrics per length, deterministic evaluation data."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F

from probe.config import Arch
from probe.data.tasks import Batch, Form, TaskConfig, make_batch, score, sequence_length
from probe.data.text import TextOptions, text_splits
from probe.errors import ProbeError
from probe.measure.batching import check_budget, micro_batches, split_batch
from probe.measure.loss import per_example, token_losses, token_losses_and_hits
from probe.measure.memory import check_forward
from probe.model import Transformer
from probe.runtime import ACCUMULATE

if TYPE_CHECKING:
    from probe.data.text import TextOptions

METRICS = ("exact_match", "token_accuracy", "loss")


def form_for(arch: Arch | str) -> Form:
    """The task form an architecture is trained on."""
    return Form(str(Arch(arch)))


def forward_batch(model: Transformer, batch: Batch, positions: torch.Tensor | None = None):
    """logits [batch, seq, vocab] for a task batch (the source goes to the encoder)."""
    return model(batch.inputs, source=batch.source, positions=positions)


def features_batch(model: Transformer, batch: Batch, positions: torch.Tensor | None = None):
    """The last hidden states [batch, seq, d_model] for a batch: the forward pass without the
    vocabulary projection, for what observes activations and needs no logits."""
    return model.features(batch.inputs, source=batch.source, positions=positions)


def batch_loss(
    model: Transformer,
    batch: Batch,
    reduction: str = "mean",
    logits: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy over the answer positions: a scalar ("mean") or one per example ("none");
    `label_smoothing` mixes the targets with a uniform distribution (training only)."""
    if batch.reference is not None:
        pooled = model.features(batch.inputs, positions=positions).float().mean(1)  # [batch, d]
        each = 1 - F.cosine_similarity(pooled, batch.reference.float(), dim=-1)  # [batch]
        return each if reduction == "none" else each.mean()
    if logits is None:  # the vocabulary projection in chunks, scored positions only
        hidden = features_batch(model, batch, positions)  # [batch, seq, d_model]
        mask = batch.loss_mask  # [batch, seq]
        scored = hidden[mask]  # [scored, d_model]
        targets = batch.targets[mask]  # [scored]
        token_loss = token_losses(model, scored, targets, label_smoothing=label_smoothing)
        each = per_example(token_loss, mask)  # [batch]
    else:
        token_loss = F.cross_entropy(
            logits.float().transpose(1, 2),
            batch.targets,
            reduction="none",
            label_smoothing=label_smoothing,
        )  # [batch, seq]
        mask = batch.loss_mask.float()  # [batch, seq]
        each = (token_loss * mask).sum(1) / mask.sum(1).clamp_min(1)  # [batch]
    if reduction == "none":
        return each
    if reduction == "mean":
        return each.mean()
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def check_lengths(model: Transformer, task: TaskConfig, lengths: Iterable[int]) -> None:
    """Refuse lengths a learned positional table cannot represent, with a clear message."""
    limit = model.cfg.max_positions
    if limit is None:
        return
    form = form_for(model.cfg.arch)
    for n in lengths:
        seq = sequence_length(task, form, n)
        if seq > limit:
            raise ProbeError(
                f"length {n} needs {seq} positions but this model's learned positional table has "
                f"{limit}; evaluate at shorter lengths or train with a larger --max-len."
            )


def eval_batches(
    task: TaskConfig,
    form: Form | str,
    lengths: Iterable[int],
    batch_size: int = 64,
    n_batches: int = 2,
    seed: int = 0,
) -> list[Batch]:
    """Deterministic evaluation data: n_batches batches per length, from one seeded generator."""
    generator = torch.Generator().manual_seed(int(seed))
    return [
        make_batch(task, form, n, batch_size, generator) for n in lengths for _ in range(n_batches)
    ]


@torch.no_grad()
def evaluate(
    model: Transformer,
    task: TaskConfig,
    lengths: Iterable[int],
    *,
    batch_size: int = 64,
    n_batches: int = 2,
    seed: int = 1234,
    device: torch.device | str | None = None,
    progress=None,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Exact match, token accuracy and loss per task length: a tidy table with columns
    length, metric, value, n (n = examples). Teacher-forced argmax, which equals greedy decoding
    for exact match. Each batch runs in micro-batches of at most `max_batch_tokens` tokens
    (None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`); the metrics are sums over examples."""
    lengths = list(lengths)
    check_lengths(model, task, lengths)
    budget = check_budget(max_batch_tokens)
    if lengths:
        seq = sequence_length(task, form_for(model.cfg.arch), max(lengths))
        check_forward(model.cfg, batch_size, seq, max_batch_tokens=budget)
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows = []
    form = form_for(model.cfg.arch)
    try:
        for i, n in enumerate(lengths):
            exact_sum = token_sum = loss_sum = 0.0
            count = 0
            data = eval_batches(task, form, [n], batch_size, n_batches, seed + n)
            for batch in micro_batches(data, budget):
                batch = batch.to(device)
                logits = forward_batch(model, batch)  # [batch, seq, vocab]
                exact, tokens = score(logits, batch)
                loss = batch_loss(model, batch, "none", logits=logits)
                exact_sum += exact.float().sum().item()
                token_sum += tokens.sum().item()
                loss_sum += loss.sum().item()
                count += exact.numel()
            for metric, total in zip(METRICS, (exact_sum, token_sum, loss_sum), strict=True):
                rows.append({"length": n, "metric": metric, "value": total / count, "n": count})
            if progress is not None:
                progress(i + 1, len(lengths))
    finally:
        model.train(was_training)
    return pd.DataFrame(rows, columns=["length", "metric", "value", "n"])


# ------------------------------------------------------------------ imported models on text
def _pooled(model: Transformer, batch: Batch, budget: int | None) -> torch.Tensor:
    """Mean-pooled last hidden states [batch, d_model] (float32), a micro-batch at a time."""
    device = model.embed.weight.device
    parts = [model.features(part.inputs.to(device)).to(ACCUMULATE).mean(1)  # [rows, d_model]
             for part in split_batch(batch, budget)]  # fmt: skip
    return torch.cat(parts)


@torch.no_grad()
def with_reference(model: Transformer, batches: Sequence[Batch],
                   max_batch_tokens: int | None = None) -> list[Batch]:  # fmt: skip
    """Each batch paired with `model`'s own mean-pooled embeddings (the embedding objective:
    a pruned model is scored by how close it stays to these)."""
    out = []
    for b in batches:
        pooled = _pooled(model, b, max_batch_tokens)  # [batch, d_model]
        out.append(replace(b, reference=pooled.to(b.inputs.device)))
    return out


@torch.no_grad()
def _embedding_metrics(model: Transformer, batches: Sequence[Batch],
                       budget: int | None = None) -> dict[str, float]:  # fmt: skip
    """similarity: mean cosine of each row's mean-pooled embedding to its reference; neighbours:
    the share of rows whose nearest other row (by cosine) is the same as under the references."""
    pooled, refs = [], []
    for b in batches:
        pooled.append(_pooled(model, b, budget).cpu())  # [batch, d]
        refs.append(b.reference.float().cpu())
    mine, theirs = F.normalize(torch.cat(pooled), dim=-1), F.normalize(torch.cat(refs), dim=-1)
    similarity = float((mine * theirs).sum(-1).double().mean())
    n = mine.shape[0]
    if n < 2:
        return {"similarity": similarity, "examples": n}
    eye = torch.eye(n, dtype=torch.bool)
    near = (mine @ mine.T).masked_fill(eye, -2.0).argmax(-1)  # [row]
    want = (theirs @ theirs.T).masked_fill(eye, -2.0).argmax(-1)  # [row]
    agree = float((near == want).double().mean())
    return {"similarity": similarity, "neighbours": agree, "examples": n}


@torch.no_grad()
def text_metrics(
    model: Transformer,
    batches: Sequence[Batch],
    objective: str,
    accuracy: bool = False,
    max_batch_tokens: int | None = None,
) -> dict[str, float]:
    """What fits an imported model on text batches: loss and perplexity for language models
    (next-token or masked-token; with `accuracy`, token accuracy from the same forward pass);
    for sentence encoders the mean cosine similarity to the reference embeddings and the
    agreement of nearest neighbours. Batches run in micro-batches of `max_batch_tokens` tokens,
    the vocabulary projection over the scored positions in chunks (`probe.measure.loss`)."""
    device = model.embed.weight.device
    if objective == "embedding":
        return _embedding_metrics(model, batches, max_batch_tokens)
    total, count, right = 0.0, 0, 0
    for b in micro_batches(batches, max_batch_tokens):
        b = b.to(device)
        hidden = features_batch(model, b)[b.loss_mask]  # [scored, d_model]
        token_loss, hits = token_losses_and_hits(model, hidden, b.targets[b.loss_mask])
        total += float(token_loss.double().sum())
        count += int(b.loss_mask.sum())
        right += int(hits.sum())
    mean = total / max(count, 1)
    out = {"loss": mean, "perplexity": math.exp(min(mean, 700.0)), "tokens": count}
    if accuracy:
        out["token_accuracy"] = right / max(count, 1)
    return out


def text_splits_for(
    model: Transformer,
    tokenizer,
    objective: str,
    docs: Sequence[str],
    max_tokens: int,
    batch_size: int,
    n_batches: int,
    n_importance: int = 1,
    seed: int = 0,
    reference: bool = True,
    options: TextOptions | None = None,
    max_batch_tokens: int | None = None,
) -> tuple[list[list[Batch]], list[Batch]]:
    """Disjoint text batches for importance (n_importance sets) and for scoring, for an imported
    model's objective; sentence encoders get `model`'s own embeddings as the reference (unless
    `reference` is False: for uses that compute no loss, such as attention statistics).
    `options` names the caller's text settings in messages (default: --max-tokens ...)."""
    options = options or TextOptions()
    limit = model.cfg.max_positions
    if limit is not None and max_tokens > limit:
        raise ProbeError(
            f"{options.width} {max_tokens} is longer than this model's learned position table "
            f"({limit} positions); use {options.width} {limit} or fewer."
        )
    sets, scoring = text_splits(docs, tokenizer, objective, max_tokens, batch_size, n_batches,
                                n_importance, seed, options)  # fmt: skip
    if objective == "embedding" and reference:
        sets = [with_reference(model, s, max_batch_tokens) for s in sets]
        scoring = with_reference(model, scoring, max_batch_tokens)
    return sets, scoring


def evaluate_text(
    model: Transformer,
    tokenizer,
    objective: str,
    docs: Sequence[str],
    widths: Iterable[int],
    batch_size: int,
    n_batches: int,
    seed: int = 0,
    reference: Transformer | None = None,
    options: TextOptions | None = None,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """An imported model's text metrics at each row width: columns length (tokens per row),
    metric, value, n. A sentence encoder is scored against `reference`'s embeddings (the
    unpruned model; itself when None). `options` names the caller's text settings in messages
    (default: the row width is --lengths, as `probe eval` calls it)."""
    options = options or TextOptions(width="--lengths")
    rows = []
    for width in widths:
        _, batches = text_splits_for(reference or model, tokenizer, objective, docs, width,
                                     batch_size, n_batches, 0, seed, options=options,
                                     max_batch_tokens=max_batch_tokens)  # fmt: skip
        metrics = text_metrics(model, batches, objective, max_batch_tokens=max_batch_tokens)
        n = metrics.pop("examples", None) or metrics.pop("tokens", None)
        rows += [{"length": width, "metric": k, "value": v, "n": n} for k, v in metrics.items()]
    return pd.DataFrame(rows, columns=["length", "metric", "value", "n"])
