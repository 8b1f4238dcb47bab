"""The data a checkpoint's heads are scored on, built in one place so that every command that
scores importance (`probe importance`, `probe prune`, `probe view`) scores the same batches
for the same options: task splits for a model trained here, text rows for an imported one
(a sentence encoder's rows carry the model's own embeddings as the reference its loss needs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from probe.data.tasks import Batch, TaskConfig
from probe.data.text import read_documents
from probe.measure.evaluate import form_for, text_splits_for
from probe.pruning.importance import disjoint_splits


def checkpoint_splits(
    ckpt,
    lengths: Sequence[int],
    batch_size: int,
    batches: int,
    seed: int,
    n_importance: int = 1,
    *,
    text: Path | None = None,
    whole: bool = False,
    max_tokens: int = 128,
    task: TaskConfig | None = None,
    options=None,
    max_batch_tokens: int | None = None,
) -> tuple[list[list[Batch]], list[Batch]]:
    """(n_importance importance splits, a scoring split) for `ckpt`: text rows of `max_tokens`
    tokens from `text` (None: the shipped corpus) for an imported model, else `task` (default:
    the one trained on) at `lengths`, with every scoring example removed from the importance
    splits; `options` (a `probe.data.text.TextOptions`) names the caller's text settings in
    messages. A sentence encoder's reference embeddings are made `max_batch_tokens` tokens at a
    time."""
    if ckpt.imported:
        docs = read_documents(text, whole=whole)
        return text_splits_for(ckpt.model, ckpt.tokenizer(), ckpt.objective, docs, max_tokens,
                               batch_size, batches, n_importance, seed, options=options,
                               max_batch_tokens=max_batch_tokens)  # fmt: skip
    form = form_for(ckpt.model_cfg.arch)
    return disjoint_splits(
        task or ckpt.task, form, lengths, batch_size=batch_size, n_batches=batches, seed=seed,
        n_importance=n_importance,
    )  # fmt: skip
