"""Recording per-head attention statistics while a model runs.

    stats = AttentionStats(["entropy", "max_logit"])
    with torch.no_grad(), model.observe(stats):
        model(tokens)
    stats.table()  # layer, site, head, statistic, value, min, max, n

`AttentionStats` is an observer (see `probe.model.attention.Observer`): each attention call is
summarised per query row from the call's q and k (`probe.measure.streaming`) and only per-head sums,
minima and maxima are kept, so no n x n matrix outlives the call. Below the streaming threshold
the statistics materialize the weights of a few examples at a time anyway, and hand the model
softmax(logits) @ v through `attend`, so attention runs once; above it the model keeps its fused
path and the statistics go over key tiles with an online softmax.
`model.observe` removes the observer when the block ends, even on error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pandas as pd
import torch

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.measure.evaluate import features_batch
from probe.measure.streaming import (
    MAX_STATISTICS,
    STATISTICS,
    STREAM_ABOVE,
    finish_rows,
    row_values,
    rows_and_output,
)
from probe.model import AttentionCall, Transformer
from probe.words import did_you_mean

TABLE_COLUMNS = ["layer", "site", "head", "statistic", "value", "min", "max", "n"]


def check_statistics(statistics: Iterable[str] | None) -> list[str]:
    """The statistic names asked for (None: all), each checked against STATISTICS."""
    if statistics is None:
        return list(STATISTICS)
    if isinstance(statistics, str):
        statistics = [statistics]
    names = list(dict.fromkeys(statistics))
    for name in names:
        if name not in STATISTICS:
            raise ProbeError(
                f"Unknown attention statistic '{name}'.{did_you_mean(name, list(STATISTICS))} "
                f"Available: {', '.join(STATISTICS)}."
            )
    if not names:
        raise ProbeError("Ask for at least one attention statistic.")
    return names


def check_streaming(streaming: bool | str) -> bool | str:
    if streaming in (True, False, "auto"):
        return streaming
    raise ProbeError(f"streaming must be true, false or 'auto', got {streaming!r}.")


class _SiteTotals:
    """Per-head running sum, count, min and max of each statistic at one attention site."""

    def __init__(self, site: str, heads: tuple[int, ...]) -> None:
        self.site, self.heads = site, heads
        self.sum = self.count = self.min = self.max = None  # [statistic, head] each

    def add(self, values: torch.Tensor) -> None:
        """values [statistic, batch, head, q], NaN where a row does not count."""
        s, b, h, q = values.shape
        values = values.transpose(1, 2).reshape(s, h, -1)  # [statistic, head, rows]
        total = values.sum(-1)  # [statistic, head]
        count = torch.full_like(total, b * q, dtype=torch.long)
        low, high = values.amin(-1), values.amax(-1)
        partial = total.isnan().any(-1).nonzero().squeeze(-1)  # statistics with NaN rows
        if partial.numel():  # only these pay for leaving their NaN rows out
            part = values.index_select(0, partial)  # [partial, head, rows]
            hidden = part.isnan()
            total[partial] = part.nansum(-1)
            count[partial] = b * q - hidden.sum(-1)
            low[partial] = part.masked_fill(hidden, float("inf")).amin(-1)
            high[partial] = part.masked_fill(hidden, float("-inf")).amax(-1)
        if self.sum is None:
            self.sum, self.count, self.min, self.max = total, count, low, high
            return
        self.sum, self.count = self.sum + total, self.count + count
        self.min, self.max = torch.minimum(self.min, low), torch.maximum(self.max, high)


class AttentionStats:
    """An observer accumulating per-(layer, head) statistics over any number of forward passes.

    statistics: names from `probe.measure.streaming.STATISTICS` (None: all); only these are
    computed. streaming: True (always over key tiles), False (one materialized tile) or "auto"
    (tiles once a call has more than `stream_above` keys); `tile` keys per tile (None: sized
    automatically).
    """

    needs_weights = False  # never the explicit path: `attend` or the fused one

    def __init__(
        self,
        statistics: Iterable[str] | None = None,
        *,
        streaming: bool | str = "auto",
        stream_above: int = STREAM_ABOVE,
        tile: int | None = None,
    ) -> None:
        self.statistics = check_statistics(statistics)
        self.streaming = check_streaming(streaming)
        self.stream_above = int(stream_above)
        self.tile = tile
        self._sites: dict[int, _SiteTotals] = {}
        self._pending: tuple[AttentionCall, object] | None = None  # rows from attend()

    def _stream(self, call: AttentionCall) -> bool:
        k_len = call.k.shape[2]
        return self.streaming is True or (self.streaming == "auto" and k_len > self.stream_above)

    def attend(self, call: AttentionCall) -> torch.Tensor | None:
        """Below the streaming threshold the statistics materialize the attention weights
        anyway: return softmax(logits) @ v from them so the model does not compute attention
        twice (None: the model computes its output itself)."""
        if self._stream(call):
            return None
        with torch.no_grad():
            rows, out = rows_and_output(call, self.statistics)
        self._pending = (call, rows)  # record() finishes them once head_out is known
        return out

    def record(self, call: AttentionCall) -> None:
        pending, self._pending = self._pending, None
        with torch.no_grad():
            if pending is not None and pending[0] is call:
                values = finish_rows(call, self.statistics, pending[1])  # [stat, b, head, q]
            else:
                values = row_values(call, self.statistics, self.tile, self._stream(call))
            totals = self._sites.get(call.layer)
            if totals is None:
                totals = self._sites[call.layer] = _SiteTotals(call.site.name, call.kept_heads)
            totals.add(values)

    def reset(self) -> None:
        self._sites.clear()

    def table(self, **ids) -> pd.DataFrame:
        """Tidy table: one row per (layer, head, statistic) with `value` (the mean over query rows
        and examples; the maximum for max_logit and raw_logit_max), `min` and `max` over rows,
        and `n` (rows counted); `ids` become constant leading columns (e.g. length=16)."""
        records = []
        for layer in sorted(self._sites):
            site = self._sites[layer]
            count = site.count.cpu()
            mean = (site.sum.cpu() / count.clamp_min(1)).tolist()
            low, high, count = site.min.cpu().tolist(), site.max.cpu().tolist(), count.tolist()
            for s, name in enumerate(self.statistics):
                for h, head in enumerate(site.heads):
                    n = int(count[s][h])
                    value = high[s][h] if name in MAX_STATISTICS else mean[s][h]
                    empty = float("nan")
                    records.append(
                        {
                            **ids,
                            "layer": layer,
                            "site": site.site,
                            "head": head,
                            "statistic": name,
                            "value": value if n else empty,
                            "min": low[s][h] if n else empty,
                            "max": high[s][h] if n else empty,
                            "n": n,
                        }
                    )
        return pd.DataFrame(records, columns=[*ids, *TABLE_COLUMNS])


class Fanout:
    """Several observers as one (`model.observe` takes one): weights are computed if any asks."""

    def __init__(self, *observers) -> None:
        self.observers = observers
        self.needs_weights = any(o.needs_weights for o in observers)

    def record(self, call: AttentionCall) -> None:
        for observer in self.observers:
            observer.record(call)


def _forward(model: Transformer, batch: Batch) -> torch.Tensor:
    return features_batch(model, batch)  # no logits: only the attention is observed


def attention_stats(
    model: Transformer,
    batches: Sequence[Batch],
    statistics: Iterable[str] | None = None,
    streaming: bool | str = "auto",
    *,
    tile: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Per-head statistics of `model` on `batches` (run in eval mode under no_grad; the model's
    mode is restored): the `AttentionStats.table` columns with a leading `length` column, one
    group per task length among the batches. `progress(done, total)` is called per batch."""
    statistics = check_statistics(statistics)
    batches = list(batches)
    if not batches:
        raise ProbeError("attention_stats needs at least one batch.")
    device = next(model.parameters()).device
    by_length: dict[int, AttentionStats] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i, batch in enumerate(batches):
                stats = by_length.setdefault(
                    batch.length, AttentionStats(statistics, streaming=streaming, tile=tile)
                )
                with model.observe(stats):
                    _forward(model, batch.to(device))
                if progress is not None:
                    progress(i + 1, len(batches))
    finally:
        model.train(was_training)
    tables = [by_length[n].table(length=n) for n in sorted(by_length)]
    return pd.concat(tables, ignore_index=True)
