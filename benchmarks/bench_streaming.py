"""Benchmark (b): streaming (online softmax over key tiles) against materialized entropy, one head,
d_k = 64, causal mask, n = 1024, 4096, 8192: peak memory and time, as ratios, in one process.

Peak memory on the CPU is the rise of the process's resident high-water mark (VmHWM, reset
through /proc/self/clear_refs) over the resident size before the call; malloc's mmap threshold is
pinned so that freed blocks go back to the system between measurements. On a CUDA device it is
torch.cuda.max_memory_allocated over the memory allocated before the call.

    .venv/bin/python benchmarks/bench_streaming.py [--sizes 1024,4096,8192] [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import statistics
import time
from pathlib import Path

import torch

from probe.measure.streaming import entropy_materialized, entropy_streaming, tile_size
from probe.model.call import AttentionCall


def pin_malloc() -> None:
    """Fix glibc's mmap threshold (disables its dynamic growth) so big frees return memory."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_mb(fn, device: torch.device) -> float:
    """Extra memory at the peak of fn() over what was in use before it, in MiB."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
    before = rss_kb("VmRSS")
    fn()
    return (rss_kb("VmHWM") - before) / 1024


def make_call(n: int, d: int, device: torch.device) -> AttentionCall:
    g = torch.Generator().manual_seed(n)
    q = torch.randn(1, 1, n, d, generator=g).to(device)
    k = torch.randn(1, 1, n, d, generator=g).to(device)
    visible = torch.ones(n, n, dtype=torch.bool, device=device).tril().view(1, 1, n, n)
    scale = torch.full((1,), d**-0.5, device=device)
    return AttentionCall("blocks.0.attn", 0, (0,), q, k, k, scale, None, None, visible)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024,4096,8192")
    parser.add_argument("--d-k", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pin_malloc()
    device = torch.device(args.device)

    def materialized(call):
        _, logits = call.logits()  # [1, 1, n, n]
        return entropy_materialized(logits)

    def streamed(call):
        return entropy_streaming(call)

    print(
        f"torch {torch.__version__}, {device}, {torch.get_num_threads()} thread(s), one head, "
        f"d_k {args.d_k}, causal; memory = peak rise over the inputs; time = median of "
        f"{args.repeats}"
    )
    print(
        f"{'n':>6s} {'tile':>5s} {'mat MiB':>9s} {'str MiB':>9s} {'mem ratio':>9s} "
        f"{'mat s':>7s} {'str s':>7s} {'time ratio':>10s} {'max |dH|':>9s}"
    )
    for n in (int(x) for x in args.sizes.split(",")):
        call = make_call(n, args.d_k, device)
        want = materialized(call)
        got = streamed(call)
        err = float((want - got).abs().max())
        del want, got
        mem_m = peak_mb(lambda call=call: materialized(call), device)
        mem_s = peak_mb(lambda call=call: streamed(call), device)
        times = {"m": [], "s": []}
        for _ in range(args.repeats):
            for key, fn in (("m", materialized), ("s", streamed)):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                fn(call)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times[key].append(time.perf_counter() - start)
        t_m, t_s = statistics.median(times["m"]), statistics.median(times["s"])
        print(
            f"{n:6d} {tile_size(call):5d} {mem_m:9.1f} {mem_s:9.1f} {mem_s / mem_m:8.1%} "
            f"{t_m:7.3f} {t_s:7.3f} {t_s / t_m:9.2f}x {err:9.1e}"
        )


if __name__ == "__main__":
    main()
