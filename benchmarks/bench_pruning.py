"""Benchmark: head importance and pruned-model speed, as ratios measured side by side in one run.

(1) gradient importance for every head (one backward per batch) against one plain evaluation
    pass over the same data (target <= 3x); ablation needs layers x heads + 1 passes, so its ratio
    is printed too.
(2) a model with 50% of its heads physically pruned against the original (and the masked
    original) at batch 1, 16 and 64: whole forward and attention sub-layers alone (target at
    batch 64: attention <= 0.6x).

    .venv/bin/python benchmarks/bench_pruning.py [--repeats 7] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.measure.evaluate import eval_batches
from probe.model import Transformer
from probe.pruning.curves import score_batches
from probe.pruning.heads import masked, prune_heads
from probe.pruning.importance import head_importance
from probe.pruning.timing import time_forward, time_ratios, timing_batches

TASK = TaskConfig()  # copy, 16 symbols
IMPORTANCE_CASE = ModelConfig(n_layer=3, d_model=128, n_head=4, vocab_size=TASK.vocab_size)
SPEED_CASE = ModelConfig(n_layer=4, d_model=256, n_head=8, vocab_size=TASK.vocab_size)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def importance_ratios(device: torch.device, repeats: int) -> None:
    torch.manual_seed(0)
    model = Transformer(IMPORTANCE_CASE).to(device).eval()
    batches = [b.to(device) for b in eval_batches(TASK, "decoder", range(4, 21, 4), 64, 1, 0)]
    n_heads = sum(m.n_kept for m in model.attention_modules())
    score_batches(model, batches)  # warm-up
    head_importance(model, batches, "gradient")
    plain, grad = [], []
    for _ in range(repeats):  # interleaved so load drifts hit both alike
        plain.append(median_time(lambda: score_batches(model, batches), 1))
        grad.append(median_time(lambda: head_importance(model, batches, "gradient"), 1))
    ablation = median_time(lambda: head_importance(model, batches, "ablation"), 1)
    p, g = statistics.median(plain), statistics.median(grad)
    print(f"(1) importance on {len(batches)} batches of 64, 3x128 decoder, {n_heads} heads")
    print(f"    plain evaluation pass     {p * 1e3:8.1f} ms")
    print(f"    gradient, all heads       {g * 1e3:8.1f} ms   ratio {g / p:5.2f}x  (target <= 3x)")
    print(
        f"    ablation, {n_heads + 1} passes       {ablation * 1e3:8.1f} ms   "
        f"ratio {ablation / p:5.2f}x  (layers x heads + 1 = {n_heads + 1})"
    )


def speed_ratios(device: torch.device, repeats: int) -> None:
    torch.manual_seed(0)
    model = Transformer(SPEED_CASE).to(device).eval()
    remove = [(layer, h) for layer in range(SPEED_CASE.n_layer) for h in range(0, 8, 2)]
    pruned = prune_heads(model, remove)
    with masked(model, remove):
        masked_model = prune_heads(model, [])  # same size, half of the gates at 0
    batch = eval_batches(TASK, "decoder", [16], 64, 1, 0)[0]  # 34 tokens
    timing = time_forward(
        {"original": model, "masked": masked_model, "pruned": pruned},
        timing_batches(batch, (1, 16, 64)),
        warmup=3,
        repeats=repeats,
    )
    ratios = time_ratios(timing).set_index(["variant", "batch_size", "part"])["ratio"]
    by_min = timing.assign(seconds=timing["min_seconds"])
    min_ratios = time_ratios(by_min).set_index(["variant", "batch_size", "part"])["ratio"]
    print(f"(2) 50% of heads pruned, 4x256 decoder (8 -> 4 heads per layer), 34 tokens, {device}")
    print(f"    {'batch':>5s} {'part':>10s} {'original ms':>12s} {'masked/orig':>12s} "
          f"{'pruned/orig':>12s} {'(by min)':>9s}")  # fmt: skip
    seconds = timing.set_index(["variant", "batch_size", "part"])["seconds"]
    for size in (1, 16, 64):
        for part in ("model", "attention"):
            print(
                f"    {size:5d} {part:>10s} {seconds[('original', size, part)] * 1e3:12.2f} "
                f"{ratios[('masked', size, part)]:11.2f}x {ratios[('pruned', size, part)]:11.2f}x "
                f"{min_ratios[('pruned', size, part)]:8.2f}x"
            )
    print(
        "    ratios of medians (of the minimum in the last column); target: attention at batch 64"
    )
    print("    <= 0.6x. masked/orig should read 1.00x: its distance from 1 is the noise level.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {device}, "
        f"median of {args.repeats} interleaved repeats"
    )
    importance_ratios(device, args.repeats)
    speed_ratios(device, args.repeats)


if __name__ == "__main__":
    main()
