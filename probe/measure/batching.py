"""Micro-batches: a statistical batch run through the model a token budget at a time.

`--batch-size` says how many examples a statistic averages over; memory is set by how many tokens
one forward (and backward) pass holds. Every analysis sums per-example or per-token quantities
(in float32 or wider, `probe.runtime.ACCUMULATE`) and counts what it summed, over the
micro-batches `micro_batches` cuts, so its result equals the whole batch's up to float rounding
while its peak memory follows `max_batch_tokens`, not the batch:

    for part in micro_batches(batches, max_batch_tokens):   # rows of each batch, in order
        totals += per_example_statistic(model, part).sum(0)
        n += part.inputs.shape[0]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from probe.errors import ProbeError

if TYPE_CHECKING:  # nothing here imports torch: the CLI's --help reads DEFAULT_BATCH_TOKENS
    from probe.data.tasks import Batch

# tokens one pass holds by default: with activation checkpointing and the chunked loss, a
# forward and backward pass of SmolLM2-135M holds about 0.2 GB at this size, an 8B model
# about 2 GB (float32); a larger budget is barely faster on the CPU
DEFAULT_BATCH_TOKENS = 4096


def check_budget(max_batch_tokens: int | None) -> int:
    """The token budget asked for (None: DEFAULT_BATCH_TOKENS), checked to be a count >= 1."""
    if max_batch_tokens is None:
        return DEFAULT_BATCH_TOKENS
    if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int):
        raise ProbeError(f"--max-batch-tokens must be an integer, got {max_batch_tokens!r}.")
    if max_batch_tokens < 1:
        raise ProbeError(f"--max-batch-tokens must be at least 1, got {max_batch_tokens}.")
    return max_batch_tokens


def row_tokens(batch: Batch) -> int:
    """Tokens one example of `batch` puts through the model: its inputs and (encoder-decoder)
    its source."""
    source = 0 if batch.source is None else batch.source.shape[1]
    return batch.inputs.shape[1] + source


def rows_per_pass(seq: int, max_batch_tokens: int | None) -> int:
    """Examples of `seq` tokens in one pass of at most `max_batch_tokens` tokens (at least one:
    a single example longer than the budget still runs, alone)."""
    return max(1, check_budget(max_batch_tokens) // max(seq, 1))


def split_batch(batch: Batch, max_batch_tokens: int | None) -> list[Batch]:
    """`batch` cut into consecutive slices of rows, each within the token budget (the batch
    itself when it fits)."""
    n = batch.inputs.shape[0]
    per = rows_per_pass(row_tokens(batch), max_batch_tokens)
    if per >= n:
        return [batch]
    return [_rows(batch, start, min(start + per, n)) for start in range(0, n, per)]


def micro_batches(batches: Iterable[Batch], max_batch_tokens: int | None) -> Iterator[Batch]:
    """Every batch's micro-batches, in order (`split_batch`)."""
    budget = check_budget(max_batch_tokens)
    for batch in batches:
        yield from split_batch(batch, budget)


def _rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows start..stop-1 of `batch` (views, no copy)."""

    def cut(t):
        return None if t is None else t[start:stop]

    return replace(batch, inputs=batch.inputs[start:stop], targets=batch.targets[start:stop],
                   loss_mask=batch.loss_mask[start:stop], source=cut(batch.source),
                   reference=cut(batch.reference))  # fmt: skip
