"""Benchmark (a): evaluation with every attention statistic recorded, against plain evaluation
on the fused attention path, in one process, interleaved. Prints ratios (target <= 1.3x).

    .venv/bin/python benchmarks/bench_observe.py [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from probe.config import ModelConfig
from probe.evaluate import evaluate
from probe.model import Transformer
from probe.observe import AttentionStats
from probe.tasks import TaskConfig

CASES = [
    # (label, model config, task lengths)
    (
        "3x128 decoder, copy 4-20",
        ModelConfig(n_layer=3, d_model=128, n_head=4, vocab_size=21),
        range(4, 21),
    ),
    (
        "3x128 decoder, copy 48-64",
        ModelConfig(n_layer=3, d_model=128, n_head=4, vocab_size=21, max_len=256),
        range(48, 65, 4),
    ),
    (
        "2x64 alibi encoder, copy 4-20",
        ModelConfig(arch="encoder", pe="alibi", n_layer=2, d_model=64, n_head=4, vocab_size=21),
        range(4, 21),
    ),
]


def timed(fn) -> float:
    """CPU seconds of this process (one thread): steadier than wall time on a shared machine."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = TaskConfig()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"median CPU time of {args.repeats} interleaved runs"
    )
    print(
        f"{'case':34s} {'plain s':>8s} {'all stats':>10s} {'ratio':>6s} "
        f"{'entropy+p_max':>14s} {'ratio':>6s}"
    )
    for label, cfg, lengths in CASES:
        torch.manual_seed(0)
        model = Transformer(cfg).eval()

        def plain(model=model, lengths=lengths):
            evaluate(model, task, lengths, batch_size=64, n_batches=2)

        def observed(names=None, model=model, lengths=lengths):
            stats = AttentionStats(names)
            with model.observe(stats):
                evaluate(model, task, lengths, batch_size=64, n_batches=2)
            stats.table()

        def subset():
            observed(["entropy", "p_max"])

        runs = {"plain": [], "all": [], "subset": []}
        plain(), observed()  # warm-up
        for _ in range(args.repeats):
            runs["plain"].append(timed(plain))
            runs["all"].append(timed(observed))
            runs["subset"].append(timed(subset))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(
            f"{label:34s} {med['plain']:8.3f} {med['all']:10.3f} "
            f"{med['all'] / med['plain']:5.2f}x {med['subset']:14.3f} "
            f"{med['subset'] / med['plain']:5.2f}x"
        )


if __name__ == "__main__":
    main()
