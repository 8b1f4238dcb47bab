"""What one attention layer's core costs as the sequence grows: the Transformer paper's O(N^2).

For q, k, v of shape [batch, head, N, d_head] (float32, random, seeded), each method is timed
(time.perf_counter after a warm-up call, one sample per repeat, methods interleaved repeat by
repeat so that machine load drifts hit every method alike) and its peak memory is measured:

    explicit           softmax(q k^T / sqrt(d) + mask) v, materializing [batch, head, N, N] twice
                       (the scores, then the weights)
    sdpa               torch's fused scaled_dot_product_attention (a flash-style kernel on the CPU
                       for float32 in recent versions): the same output without an N x N matrix
    streaming_entropy  the entropy of every query row over key tiles of `tile` keys with an online
                       softmax (probe.measure.streaming): memory O(rows x tile) instead of
                       O(rows x keys)
    explicit_entropy   the same entropies from the full logits (streaming.entropy_materialized): the
                       materialized counterpart of streaming_entropy

peak_bytes is a measurement, not a formula: the bytes allocated during one call beyond what was
live before it, measured once per (N, method) after the timed repeats (every call allocates the
same) and written on each repeat's row. On the CPU it is rebuilt from torch.profiler's
allocation and free events in time order (each event carries the allocator's running total); on
CUDA it is max_memory_allocated after reset_peak_memory_stats, less what was allocated before.
Inputs (q, k, v and, for the methods that take one, the [1, 1, N, N] bool causal mask, 1 byte
per pair, built once per forward as the model does) are allocated before the call and reported
apart as input_bytes.

    table = attention_cost([128, 256, 512, 1024])
    fit_slopes(table, y="seconds", min_n=512)   # method, slope, low, high, ...
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Sequence
from enum import StrEnum

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats
from torch._C._profiler import _EventType  # the event tree torch's memory profiler reads
from torch.profiler import ProfilerActivity, profile

from probe.errors import ProbeError
from probe.fields import choice
from probe.measure.memory import HEADROOM, available_bytes
from probe.measure.streaming import entropy_materialized, entropy_streaming
from probe.model.call import AttentionCall
from probe.site import Site

Progress = Callable[[int, int], None]  # (sizes done, sizes in all)
FLOAT = 4  # bytes per float32
COLUMNS = [
    "n",  # sequence length: queries = keys = n
    "method",
    "repeat",
    "seconds",  # one call, wall clock
    "peak_bytes",  # measured: allocated during one call beyond what was live before it
    "predicted_bytes",  # the rough formula used only to skip sizes that cannot fit
    "input_bytes",  # q, k, v (and the causal mask where the method takes one)
    "skipped",  # why the size was not run ("" when it was)
    "batch",
    "n_head",
    "d_head",
    "causal",
    "tile",  # keys per tile for streaming_entropy, 0 for the other methods
    "device",
]
SLOPE_COLUMNS = [
    "method",
    "x",
    "y",
    "slope",
    "low",
    "high",
    "stderr",
    "intercept",
    "points",
    "min_n",
    "max_n",
]


class CostMethod(StrEnum):
    EXPLICIT = "explicit"
    SDPA = "sdpa"
    STREAMING_ENTROPY = "streaming_entropy"
    EXPLICIT_ENTROPY = "explicit_entropy"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def causal_visible(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, n, n] bool, True where query i sees key j (j <= i)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril_().view(1, 1, n, n)


def _scores(q, k, hidden: torch.Tensor | None) -> torch.Tensor:
    """q k^T / sqrt(d_head), -inf where hidden: [batch, head, n, n], one allocation."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # [batch, head, n, n]
    if hidden is not None:
        scores.masked_fill_(hidden, float("-inf"))
    return scores


def method_call(
    method: CostMethod | str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    tile: int = 128,
    visible: torch.Tensor | None = None,
) -> Callable[[], torch.Tensor]:
    """A zero-argument callable running `method` on q, k, v ([batch, head, n, d_head] each).

    It returns the attention output [batch, head, n, d_head] (explicit, sdpa) or the entropy of
    every query row in nats [batch, head, n] (streaming_entropy, explicit_entropy). Everything
    the callable reads is built here, outside the call: `visible` ([1, 1, n, n] bool, from
    `causal_visible` when None and causal), its complement for the explicit methods, and the
    AttentionCall of the streaming method."""
    method = choice(CostMethod, method, "attention cost method")
    n, d_head = q.shape[2], q.shape[3]
    if causal and visible is None:
        visible = causal_visible(n, q.device)
    visible = visible if causal else None
    if method == CostMethod.SDPA:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if method == CostMethod.STREAMING_ENTROPY:
        h = q.shape[1]
        site = Site("attention_cost", 0, False, causal, h, h, tuple(range(h)))
        scale = torch.full((h,), d_head**-0.5, device=q.device)  # [head]
        call = AttentionCall(site, q, k, v, scale, None, None, visible)
        return lambda: entropy_streaming(call, tile=tile)  # [batch, head, n]
    hidden = None if visible is None else ~visible  # [1, 1, n, n]
    if method == CostMethod.EXPLICIT:

        def explicit() -> torch.Tensor:
            scores = _scores(q, k, hidden)  # [batch, head, n, n]
            weights = scores.softmax(dim=-1)  # [batch, head, n, n]
            return weights @ v  # [batch, head, n, d_head]

        return explicit
    return lambda: entropy_materialized(_scores(q, k, hidden))  # [batch, head, n]


def measure_peak(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated on `device` while `fn()` runs, beyond what was live before (its
    result counts while it is alive inside the call; it is dropped afterwards).

    Garbage of earlier calls is collected first: tensors kept in reference cycles (the row
    sums of probe.measure.streaming are, until the collector runs) would otherwise be freed
    inside the window and lower the peak by their size."""
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    if device.type != "cpu":
        raise ProbeError(f"Peak memory is measured on cpu or cuda devices, got '{device}'.")
    return _cpu_peak(fn)


def _cpu_peak(fn: Callable[[], object]) -> int:
    """The largest running sum of CPU allocations minus frees during fn(), from the profiler's
    allocation events in time order (the allocator's own accounting, not a formula)."""
    # kineto reads this when the profiler first starts; without it every start and stop prints
    # a log line (KINETO_LOG_LEVEL=6 silences them; a value the user set is kept)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return int(peak)


def input_bytes(
    method: CostMethod, n: int, *, batch: int, n_head: int, d_head: int, causal: bool
) -> int:
    """q, k, v in float32, plus the [n, n] bool mask for the methods that take one."""
    qkv = 3 * batch * n_head * n * d_head * FLOAT
    mask = n * n if causal and method != CostMethod.SDPA else 0
    return qkv + mask


def predicted_bytes(
    method: CostMethod, n: int, *, batch: int, n_head: int, d_head: int, tile: int
) -> int:
    """A rough upper end of a method's working memory, only to skip sizes that cannot fit:
    2 [b, h, n, n] copies for explicit, 4 for explicit_entropy (logits, log-softmax, their
    product and its cleaned copy), 8 [b, h, n, tile] copies for streaming_entropy."""
    rows = batch * n_head * n  # query rows
    if method == CostMethod.EXPLICIT:
        return (2 * rows * n + rows * d_head) * FLOAT
    if method == CostMethod.EXPLICIT_ENTROPY:
        return 4 * rows * n * FLOAT
    if method == CostMethod.STREAMING_ENTROPY:
        return (8 * rows * min(tile, n) + 16 * rows) * FLOAT
    return 2 * rows * (d_head + 1) * FLOAT + 2**20  # output, log-sum-exp, per-thread buffers


def _budget(max_bytes: int | None, device: torch.device) -> float:
    if max_bytes is not None:
        return float(max_bytes)
    if device.type == "cuda":
        return HEADROOM * torch.cuda.mem_get_info(device)[0]
    have = available_bytes()
    return math.inf if have is None else HEADROOM * have


def _check(ns: Sequence[int], sizes: dict[str, int], repeats: int) -> list[int]:
    ns = [int(n) for n in ns]
    if not ns or any(n < 1 for n in ns):
        raise ProbeError(f"Attention cost needs sequence lengths >= 1, got {ns}.")
    for name, value in sizes.items():
        if int(value) < 1:
            raise ProbeError(f"Attention cost needs {name} >= 1, got {value}.")
    if repeats < 1:
        raise ProbeError(f"Attention cost needs repeats >= 1, got {repeats}.")
    return sorted(set(ns))


@torch.no_grad()
def attention_cost(
    ns: Sequence[int],
    *,
    d_head: int = 64,
    n_head: int = 4,
    batch: int = 1,
    causal: bool = True,
    methods: Sequence[CostMethod | str] = ("explicit", "sdpa", "streaming_entropy"),
    repeats: int = 3,
    tile: int = 128,
    max_bytes: int | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    threads: int | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Seconds and measured peak bytes of one attention core per (n, method, repeat): a tidy
    table with COLUMNS. Take the median over repeats (`fit_slopes` does).

    tile: keys per tile of streaming_entropy, held fixed so its memory grows as n x tile.
    max_bytes: a size is skipped when its inputs plus `predicted_bytes` exceed this (default:
    HEADROOM of the memory available); a skipped (n, method) is one row with repeat 0, NaN
    seconds and peak_bytes, and the reason in `skipped`. threads: CPU threads torch uses while
    measuring (restored after; None leaves the setting alone)."""
    sizes = {"d_head": d_head, "n_head": n_head, "batch": batch, "tile": tile}
    ns = _check(ns, sizes | ({"threads": threads} if threads is not None else {}), repeats)
    methods = list(dict.fromkeys(choice(CostMethod, m, "attention cost method") for m in methods))
    if not methods:
        raise ProbeError(
            f"Attention cost needs at least one method: {[m.value for m in CostMethod]}."
        )
    device = torch.device(device)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(ns, methods, sizes, causal, repeats, max_bytes, seed, device, progress)
    finally:
        torch.set_num_threads(before)


def _measure(ns, methods, sizes, causal, repeats, max_bytes, seed, device, progress):
    batch, n_head, d_head, tile = sizes["batch"], sizes["n_head"], sizes["d_head"], sizes["tile"]
    budget = _budget(max_bytes, device)
    shape = {"batch": batch, "n_head": n_head, "d_head": d_head}
    rows = []
    for done, n in enumerate(ns, start=1):
        run, base = [], {}
        for m in methods:
            given = input_bytes(m, n, causal=causal, **shape)
            guess = predicted_bytes(m, n, tile=tile, **shape)
            base[m] = {
                "n": n,
                "method": m.value,
                "predicted_bytes": guess,
                "input_bytes": given,
                "skipped": "",
                **shape,
                "causal": causal,
                "tile": tile if m == CostMethod.STREAMING_ENTROPY else 0,
                "device": str(device),
            }
            if given + guess > budget:
                need, allowed = (given + guess) / 2**20, budget / 2**20
                reason = f"needs about {need:,.0f} MiB, over the {allowed:,.0f} MiB allowed"
                missing = {"repeat": 0, "seconds": np.nan, "peak_bytes": np.nan}
                rows.append(base[m] | missing | {"skipped": reason})
            else:
                run.append(m)
        if run:
            rows.extend(_measure_size(n, run, base, causal, repeats, tile, seed, device, shape))
        if progress is not None:
            progress(done, len(ns))
    return pd.DataFrame(rows, columns=COLUMNS)


def _measure_size(n, methods, base, causal, repeats, tile, seed, device, shape):
    """Rows of every method at one n, on shared inputs."""
    g = torch.Generator().manual_seed(seed)
    dims = (shape["batch"], shape["n_head"], n, shape["d_head"])
    q, k, v = (torch.randn(dims, generator=g).to(device) for _ in range(3))  # [b, h, n, d]
    visible = causal_visible(n, device) if causal else None  # [1, 1, n, n]
    calls = {m: method_call(m, q, k, v, causal=causal, tile=tile, visible=visible) for m in methods}
    for fn in calls.values():  # warm-up: kernels chosen, pages touched
        fn()
    _sync(device)
    seconds: dict[CostMethod, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for m, fn in calls.items():
            gc.collect()  # not during the call: earlier calls' reference cycles
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            seconds[m].append(time.perf_counter() - start)
    # once per method: a call allocates the same tensors every time (the committed run measured
    # it on every repeat and got one value per (n, method)); profiling is the slow part
    peaks = {m: measure_peak(fn, device) for m, fn in calls.items()}
    return [
        {**base[m], "repeat": r, "seconds": seconds[m][r], "peak_bytes": peaks[m]}
        for m in methods
        for r in range(repeats)
    ]


def fit_slopes(
    table: pd.DataFrame, *, x: str = "n", y: str = "seconds", min_n: int | None = None
) -> pd.DataFrame:
    """Per method, the least-squares slope of log(median y) against log(x) over the sizes with
    x >= min_n (all when None), and its 95% interval from the regression's standard error (t
    with points - 2 degrees of freedom; NaN with fewer than 3 points, and the slope NaN with
    fewer than 2). Columns SLOPE_COLUMNS; slope 2 is O(n^2), 1 is O(n)."""
    for column in ("method", x, y):
        if column not in table:
            raise ProbeError(
                f"The cost table has no column '{column}'; it has "
                f"{', '.join(map(str, table.columns))}."
            )
    data = table[["method", x, y]].dropna()
    if min_n is not None:
        data = data[data[x] >= min_n]
    data = data[(data[x] > 0) & (data[y] > 0)]  # log needs positive values
    medians = data.groupby(["method", x], sort=True)[y].median().reset_index()
    rows = []
    for method in dict.fromkeys(table["method"]):
        part = medians[medians["method"] == method]
        lx, ly = np.log(part[x].to_numpy(float)), np.log(part[y].to_numpy(float))
        row = {
            "method": method,
            "x": x,
            "y": y,
            "slope": np.nan,
            "low": np.nan,
            "high": np.nan,
            "stderr": np.nan,
            "intercept": np.nan,
            "points": len(part),
            "min_n": part[x].min() if len(part) else np.nan,
            "max_n": part[x].max() if len(part) else np.nan,
        }
        if len(part) >= 2:
            fit = stats.linregress(lx, ly)
            row.update(slope=fit.slope, intercept=fit.intercept)
            if len(part) >= 3:
                half = stats.t.ppf(0.975, len(part) - 2) * fit.stderr
                row.update(stderr=fit.stderr, low=fit.slope - half, high=fit.slope + half)
        rows.append(row)
    return pd.DataFrame(rows, columns=SLOPE_COLUMNS)
