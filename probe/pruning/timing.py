"""Forward-pass timing done right: no grad, warm-up passes, repeats, the median, several batch
sizes, and a budget in seconds.

Each variant (e.g. original, masked, pruned) is timed on the same inputs, interleaved repeat by
repeat so that machine load drifts hit every variant alike. Two parts are timed: the whole model
forward and its attention sub-layers alone (each site called on the very inputs it received during
a forward pass, so layer norms, FFNs and embeddings are left out). A variant is a model, or a
`Gated` model: the same weights run with other gates (a masked model without a copy of them).

With a `budget` the timing takes about that many seconds at most: one warm-up round per batch
size measures what a round costs, the repeats (at most `repeats`) share what is left among the
sizes still to time, and a larger size whose first round would not fit is left out. So a large
model's timing follows the time the caller gives it, not the other way round.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.measure.evaluate import forward_batch
from probe.model import Transformer

Progress = Callable[[int, int], None]
COLUMNS = ["variant", "batch_size", "part", "seconds", "min_seconds", "repeats"]


@dataclass(frozen=True)
class Gated:
    """`model` run with `gates` ([head] per site) in place of its own: a masked variant that
    shares the model's weights."""

    model: Transformer
    gates: list[torch.Tensor]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _attention_inputs(model: Transformer, batch: Batch) -> list[tuple]:
    """(module, keyword arguments) of every attention call in one forward pass (the sites'
    `args` points)."""
    calls = []
    points = {f"{m.site.name}.args": lambda args, m=m: calls.append((m, args))
              for m in model.attention_modules()}  # fmt: skip
    with model.intervene(points):
        forward_batch(model, batch)
    return calls


def _timers(model: Transformer, batch: Batch) -> dict[str, Callable[[], object]]:
    calls = _attention_inputs(model, batch)

    def attention() -> None:
        for module, kwargs in calls:
            module(**kwargs)

    return {"model": lambda: forward_batch(model, batch), "attention": attention}


@torch.no_grad()
def time_forward(
    variants: Mapping[str, Transformer | Gated],
    batches: Mapping[int, Batch],
    *,
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
    progress: Progress | None = None,
    budget: float | None = None,
) -> pd.DataFrame:
    """Median seconds per forward pass: tidy columns variant, batch_size, part, seconds (the
    median), min_seconds, repeats.

    batches: {batch size: batch}. part is "model" (the whole forward) or "attention" (the
    attention sub-layers only). threads: CPU threads torch uses while timing (restored after;
    None leaves the setting alone). On a shared CPU one thread gives stable numbers: idle
    threads waiting on a busy core can make a multi-threaded pass 100x slower.
    budget: seconds the whole timing may take (None: `warmup` and `repeats` exactly); with
    one, a size gets one warm-up round and at most `repeats` repeats, and sizes that would
    not fit get no rows (the module docstring).
    """
    if warmup < 0 or repeats < 1:
        raise ProbeError(f"Timing needs warmup >= 0 and repeats >= 1, got {warmup}, {repeats}.")
    if threads is not None and threads < 1:
        raise ProbeError(f"Timing needs at least one thread, got {threads}.")
    if budget is not None and not budget >= 0:
        raise ProbeError(f"A timing budget is a number of seconds >= 0, got {budget}.")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    models = {id(m): m for m in (v.model if isinstance(v, Gated) else v for v in variants.values())}
    saved = {key: [g.detach().clone() for g in m.gates()] for key, m in models.items()}
    try:
        return _time(variants, batches, warmup, repeats, progress, budget)
    finally:
        torch.set_num_threads(before)
        for key, model in models.items():  # a Gated variant leaves its model as it found it
            model.set_gates(saved[key])


def _runner(variant: Transformer | Gated) -> tuple[Transformer, list[torch.Tensor]]:
    """(model, the gates it runs with)."""
    if isinstance(variant, Gated):
        return variant.model, variant.gates
    return variant, [g.detach().clone() for g in variant.gates()]


def _time(variants, batches, warmup: int, repeats: int, progress, budget) -> pd.DataFrame:
    rows = []
    runners = {name: _runner(v) for name, v in variants.items()}
    sizes = sorted(batches)
    spent, last = 0.0, None  # seconds used; (size, seconds of one round) timed before
    for done, size in enumerate(sizes, start=1):
        if budget is not None and last is not None:
            guess = last[1] * size / last[0]  # a round's cost grows with the batch
            if spent + 2 * guess > budget:
                break  # this size's warm-up and one repeat would not fit, nor a larger one's
        started = time.perf_counter()
        timers = {}
        for name, (model, gates) in runners.items():
            model.eval()
            device = next(model.parameters()).device
            on_device = batches[size].to(device)
            model.set_gates(gates)
            for part, fn in _timers(model, on_device).items():
                timers[(name, part)] = (fn, device, model, gates)
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in timers}
        warm = warmup if budget is None else 1
        round_start = time.perf_counter()
        for _ in range(warm):
            for fn, device, model, gates in timers.values():
                model.set_gates(gates)
                fn()
                _sync(device)
        one_round = (time.perf_counter() - round_start) / max(warm, 1)
        n = repeats
        if budget is not None:
            left = budget - spent - (time.perf_counter() - started)
            share = left / (len(sizes) - done + 1)  # what is left, shared with larger sizes
            n = max(1, min(repeats, math.floor(share / max(one_round, 1e-9))))
        for _ in range(n):
            for key, (fn, device, model, gates) in timers.items():
                model.set_gates(gates)
                _sync(device)
                start = time.perf_counter()
                fn()
                _sync(device)
                samples[key].append(time.perf_counter() - start)
        for (name, part), times in samples.items():
            rows.append(
                {
                    "variant": name,
                    "batch_size": int(size),
                    "part": part,
                    "seconds": statistics.median(times),
                    "min_seconds": min(times),
                    "repeats": n,
                }
            )
        spent += time.perf_counter() - started
        last = (size, one_round)
        if progress is not None:
            progress(done, len(batches))
    return pd.DataFrame(rows, columns=COLUMNS)


def time_ratios(timing: pd.DataFrame, reference: str = "original") -> pd.DataFrame:
    """Each variant's median time over the reference's at the same batch size and part:
    columns variant, batch_size, part, ratio (below 1 is faster)."""
    if reference not in set(timing["variant"]):
        raise ProbeError(f"No variant '{reference}' in the timing table to compare against.")
    ref = timing[timing["variant"] == reference].set_index(["batch_size", "part"])["seconds"]
    out = timing.join(ref.rename("reference"), on=["batch_size", "part"])
    out = out.assign(ratio=out["seconds"] / out["reference"])
    return out[["variant", "batch_size", "part", "ratio"]].reset_index(drop=True)


def timing_batches(batch: Batch, sizes: Sequence[int] = (1, 16, 64)) -> dict[int, Batch]:
    """{size: batch} from the first `size` examples of `batch` (repeated when it is smaller)."""
    out = {}
    n = batch.inputs.shape[0]
    for size in sizes:
        if size < 1:
            raise ProbeError(f"Batch sizes for timing must be at least 1, got {size}.")
        idx = torch.arange(size) % n
        source = None if batch.source is None else batch.source[idx]
        out[int(size)] = Batch(
            batch.inputs[idx], batch.targets[idx], batch.loss_mask[idx], source, batch.length
        )
    return out
