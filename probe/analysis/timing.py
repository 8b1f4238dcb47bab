"""Forward-pass timing done right: no grad, warm-up passes, repeats, the median, several batch
sizes.

Each variant (e.g. original, masked, pruned) is timed on the same inputs, interleaved repeat by
repeat so that machine load drifts hit every variant alike. Two parts are timed: the whole model
forward and its attention sub-layers alone (each site called on the very inputs it received during
a forward pass, so layer norms, FFNs and embeddings are left out).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import pandas as pd
import torch

from probe.errors import ProbeError
from probe.evaluate import forward_batch
from probe.model import Transformer
from probe.tasks import Batch

Progress = Callable[[int, int], None]
COLUMNS = ["variant", "batch_size", "part", "seconds", "min_seconds", "repeats"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _attention_inputs(model: Transformer, batch: Batch) -> list[tuple]:
    """(module, args, kwargs) of every attention call in one forward pass."""
    calls, handles = [], []

    def capture(module, args, kwargs):
        calls.append((module, args, kwargs))

    try:
        for m in model.attention_modules():
            handles.append(m.register_forward_pre_hook(capture, with_kwargs=True))
        forward_batch(model, batch)
    finally:
        for h in handles:
            h.remove()
    return calls


def _timers(model: Transformer, batch: Batch) -> dict[str, Callable[[], object]]:
    calls = _attention_inputs(model, batch)

    def attention() -> None:
        for module, args, kwargs in calls:
            module(*args, **kwargs)

    return {"model": lambda: forward_batch(model, batch), "attention": attention}


@torch.no_grad()
def time_forward(
    variants: Mapping[str, Transformer],
    batches: Mapping[int, Batch],
    *,
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Median seconds per forward pass: tidy columns variant, batch_size, part, seconds (the
    median), min_seconds, repeats.

    batches: {batch size: batch}. part is "model" (the whole forward) or "attention" (the
    attention sub-layers only). threads: CPU threads torch uses while timing (restored after;
    None leaves the setting alone). On a shared CPU one thread gives stable numbers: idle
    threads waiting on a busy core can make a multi-threaded pass 100x slower.
    """
    if warmup < 0 or repeats < 1:
        raise ProbeError(f"Timing needs warmup >= 0 and repeats >= 1, got {warmup}, {repeats}.")
    if threads is not None and threads < 1:
        raise ProbeError(f"Timing needs at least one thread, got {threads}.")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _time(variants, batches, warmup, repeats, progress)
    finally:
        torch.set_num_threads(before)


def _time(variants, batches, warmup: int, repeats: int, progress) -> pd.DataFrame:
    rows = []
    for done, (size, batch) in enumerate(batches.items(), start=1):
        timers = {}
        for name, model in variants.items():
            model.eval()
            device = next(model.parameters()).device
            on_device = batch.to(device)
            for part, fn in _timers(model, on_device).items():
                timers[(name, part)] = (fn, device)
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in timers}
        for _ in range(warmup):
            for fn, device in timers.values():
                fn()
                _sync(device)
        for _ in range(repeats):
            for key, (fn, device) in timers.items():
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
                    "repeats": repeats,
                }
            )
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
