"""What `probe view` shows, gathered from a model: every head's statistics (attention entropy,
max logit, role scores, optionally importance) and its attention pattern on one example per
length, in the data format of `probe.report.html.viewer`.

Patterns are recorded by an observer that asks the attention modules for their weights (the
explicit softmax path), on the first example of each batch only, so a page stays small. Cross-
attention sites have no square pattern over one token sequence and show statistics only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from probe.analysis.attention import induction_period
from probe.analysis.roles import head_roles
from probe.data.tasks import Batch, TaskConfig, token_name
from probe.errors import ProbeError
from probe.measure.batching import micro_batches
from probe.measure.evaluate import check_lengths, eval_batches, features_batch, form_for
from probe.measure.observe import attention_stats
from probe.model import AttentionCall, Transformer
from probe.pruning.importance import head_importance
from probe.pruning.splits import checkpoint_splits

STATISTICS = {  # statistic of the attention table -> label in the viewer
    "normalized_entropy": "normalized entropy (H / log n)",
    "entropy": "entropy (nats)",
    "max_logit": "max logit",
    "p_max": "largest weight (confidence)",
    "sink_mass": "weight on the first token (sink)",
    "attention_distance": "mean attention distance",
}
ROLE_LABEL = "role: {}"


@dataclass
class PatternRecorder:
    """An observer keeping each self-attention head's weights for one example of the batch:
    patterns[site index][original head id] = [q_len, k_len] array."""

    row: int = 0
    needs_weights: bool = True
    patterns: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)

    def record(self, call: AttentionCall) -> None:
        if call.probs is None or call.site.cross:
            return
        probs = call.probs[self.row].detach().float().cpu().numpy()  # [head, q_len, k_len]
        site = self.patterns.setdefault(call.layer, {})
        for i, head in enumerate(call.kept_heads):
            site[head] = probs[i]


@torch.no_grad()
def record_patterns(model: Transformer, batch: Batch) -> dict[int, dict[int, np.ndarray]]:
    """The attention weights of every head on the first example of `batch`."""
    device = next(model.parameters()).device
    first = batch.rows(torch.arange(batch.inputs.shape[0]) == 0).to(device)
    recorder = PatternRecorder()
    was_training = model.training
    model.eval()
    try:
        with model.observe(recorder):
            features_batch(model, first)
    finally:
        model.train(was_training)
    return recorder.patterns


def _per_head(model: Transformer, values: pd.Series) -> list[list[float | None]]:
    """[site][original head id] from a Series indexed by (layer, head); None where absent."""
    rows = []
    for m in model.attention_modules():
        row = []
        for head in range(m.site.n_head):
            v = values.get((m.layer, head), np.nan)
            row.append(None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
        rows.append(row)
    return rows


def view_data(
    model: Transformer,
    examples: Sequence[tuple[str, Batch, list[str]]],
    stats: pd.DataFrame,
    roles: pd.DataFrame | None = None,
    importance: pd.DataFrame | None = None,
    *,
    title: str,
    subtitle: str = "",
) -> dict:
    """The viewer's data: `examples` are (label, batch, token strings of its first example);
    `stats` the long attention table (layer, head, statistic, value; averaged over lengths),
    `roles` (the role table: layer, head, statistic, value) and `importance` (layer, head,
    method, value) optional.
    Heads pruned from the weights or masked by a zero gate are marked pruned."""
    layers, pruned = [], []
    for m in model.attention_modules():
        layers.append({"name": m.site.name, "heads": list(range(m.site.n_head))})
        gates = m.gate.detach().cpu().tolist()
        kept = dict(zip(m.site.kept_heads, gates, strict=True))
        for head in range(m.site.n_head):
            if head not in kept or kept[head] == 0.0:
                pruned.append([m.layer, head])
    statistics: dict[str, dict] = {}
    mean = stats.groupby(["layer", "head", "statistic"])["value"].mean()
    for name, label in STATISTICS.items():
        if name in set(stats["statistic"]):
            values = mean.xs(name, level="statistic")
            statistics[name] = {"label": label, "values": _per_head(model, values)}
    if roles is not None and not roles.empty:
        for role, part in roles.groupby("statistic", sort=False):
            values = part.groupby(["layer", "head"])["value"].mean()
            statistics[f"role_{role}"] = {
                "label": ROLE_LABEL.format(str(role).replace("_", " ")),
                "values": _per_head(model, values),
            }
    if importance is not None and not importance.empty:
        for method, part in importance.groupby("method", sort=False):
            values = part.groupby(["layer", "head"])["value"].mean()
            statistics[f"importance_{method}"] = {
                "label": f"importance ({method})",
                "values": _per_head(model, values),
            }
    shown = []
    for label, batch, tokens in examples:
        patterns = record_patterns(model, batch)
        shown.append({
            "label": label, "tokens": list(tokens),
            "patterns": {str(layer): {str(h): p for h, p in heads.items()}
                         for layer, heads in patterns.items()},
        })  # fmt: skip
    data = {"title": title, "layers": layers, "statistics": statistics, "pruned": pruned,
            "examples": shown}  # fmt: skip
    if subtitle:
        data["subtitle"] = subtitle
    return data


def build_view(
    model: Transformer,
    examples: Sequence[tuple[str, Sequence[Batch]]],
    token_name,
    *,
    importance: str | None = "gradient",
    importance_batches: Sequence[Batch] | None = None,
    title: str,
    subtitle: str = "",
    seed: int = 0,
    max_batch_tokens: int | None = None,
) -> dict:
    """Measure and gather everything the viewer shows: statistics and role scores on all the
    batches, importance by `importance` (None: none) on `importance_batches` (default: all the
    batches), and patterns on the first example of each label's first batch.
    `token_name(id) -> str` labels the pattern's axes. Every pass holds at most
    `max_batch_tokens` tokens (`probe.measure.batching`)."""
    batches = [b for _, group in examples for b in group]
    stats = attention_stats(model, list(micro_batches(batches, max_batch_tokens)), list(STATISTICS))
    lengths = sorted({int(b.inputs.shape[1]) for b in batches})
    roles = head_roles(model, batches, period=induction_period(model, lengths), seed=seed,
                       max_batch_tokens=max_batch_tokens)  # fmt: skip
    table = None
    if importance is not None:
        table = head_importance(model, importance_batches or batches, importance, seed=seed,
                                max_batch_tokens=max_batch_tokens)  # fmt: skip
    shown = []
    for label, group in examples:
        first = group[0]
        tokens = [token_name(t) for t in first.inputs[0].tolist()]
        shown.append((label, first, tokens))
    return view_data(model, shown, stats, roles, table, title=title, subtitle=subtitle)


def _task_for(ckpt, name: str | None):
    if name is None:
        return ckpt.task
    task = TaskConfig.from_dict({**ckpt.task.to_dict(), "name": name})
    if task.vocab_size > ckpt.model_cfg.vocab_size:
        raise ProbeError(
            f"task '{name}' needs {task.vocab_size} tokens but the model knows "
            f"{ckpt.model_cfg.vocab_size}; view it on the task it was trained on "
            f"('{ckpt.task.name}')."
        )
    return task


def default_lengths(ckpt, task) -> list[int]:
    """L and 2L (L: the longest training length), 2L only where the model can take it."""
    longest = ckpt.train_cfg.train_len[1]
    lengths = [longest]
    try:
        check_lengths(ckpt.model, task, [2 * longest])
        lengths.append(2 * longest)
    except ProbeError:
        pass
    return lengths


def _subtitle(ckpt, task) -> str:
    cfg = ckpt.model_cfg
    parts = [str(cfg.arch), f"{cfg.n_layer} layers", f"{cfg.n_head} heads",
             f"d_model {cfg.d_model}", f"positions {cfg.pe}"]  # fmt: skip
    if ckpt.imported:
        parts.append(f"imported from {ckpt.source.get('model_type', ckpt.source.get('format'))}")
    else:
        parts.append(f"trained on {ckpt.task.name} (L = {ckpt.train_cfg.train_len[1]})")
        if task is not None and task.name != ckpt.task.name:
            parts.append(f"shown on {task.name}")
    return " · ".join(parts)


def checkpoint_view(
    ckpt,
    *,
    title: str,
    task: str | None = None,
    lengths: Sequence[int] | None = None,
    text=None,
    whole: bool = False,
    batch_size: int = 16,
    batches: int = 1,
    importance: str | None = "gradient",
    seed: int = 0,
    options=None,
    max_batch_tokens: int | None = None,
) -> dict:
    """The viewer's data for a checkpoint: task data at `lengths` (default L and 2L) for a
    model trained here, text rows of `lengths` tokens (default 64) for an imported one.

    Importance is scored on the batches `probe importance` scores for the same options
    (`checkpoint_splits`: the same rows, and for a sentence encoder the same reference
    embeddings), so the page's colours are that command's numbers: `probe importance --lengths`
    at these lengths, or `--max-tokens N` for an imported model viewed at one length N."""
    scored = []  # the importance split of `probe importance`
    if ckpt.imported:
        if task is not None:
            raise ProbeError(f"{ckpt.path} is an imported model: it reads text, not tasks.")
        tokenizer = ckpt.tokenizer()
        groups = []
        for n in lengths or [64]:  # the importance split: the text's first rows, as scored
            sets, first = checkpoint_splits(ckpt, [], batch_size, batches, seed,
                                            int(importance is not None), text=text,
                                            whole=whole, max_tokens=n, options=options,
                                            max_batch_tokens=max_batch_tokens)  # fmt: skip
            split = sets[0] if sets else first  # no importance: the same rows, nothing after
            groups.append((f"text rows of {n}", split))
            scored += split
        shown = None

        def namer(t: int) -> str:
            return tokenizer.id_to_token(int(t)) or f"#{t}"
    else:
        if text is not None:
            raise ProbeError(f"{ckpt.path} was trained on a task; text is for imported models.")
        shown = _task_for(ckpt, task)
        lengths = list(lengths) if lengths else default_lengths(ckpt, shown)
        check_lengths(ckpt.model, shown, lengths)
        form = form_for(ckpt.model_cfg.arch)
        groups = [(f"length {n}", eval_batches(shown, form, [n], batch_size, batches, seed + n))
                  for n in lengths]  # fmt: skip
        if importance is not None:
            (scored,), _ = checkpoint_splits(ckpt, lengths, batch_size, batches, seed, task=shown)

        def namer(t: int) -> str:
            return token_name(shown, t)

    return build_view(ckpt.model, groups, namer, importance=importance,
                      importance_batches=scored, seed=seed, title=title,
                      subtitle=_subtitle(ckpt, shown),
                      max_batch_tokens=max_batch_tokens)  # fmt: skip
