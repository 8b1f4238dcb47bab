"""Benchmark (a): evaluation with every attention statistic recorded, against plain evaluation
on the fused attention path, in one process, interleaved. Prints ratios (target <= 1.15x).

    .venv/bin/python benchmarks/bench_observe.py [--repeats 7] [--threads 1] [--only smollm2]

The tiny copy-task models are where attention is most of the cost; the SmolLM2-shaped cases
(random weights, 9 query / 3 key-value heads of 64, d_model 576, SwiGLU 1536, RMSNorm, rotary,
batch 4) are where users pay it: 4 of its 30 layers, with the vocabulary cut to 49152 x 4/30 so
the unembedding keeps its share of the forward pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.measure.evaluate import evaluate
from probe.measure.observe import AttentionStats
from probe.model import Transformer

SMOLLM2 = ModelConfig(
    n_layer=4,
    d_model=576,
    n_head=9,
    n_kv_head=3,
    d_head=64,
    ffn="swiglu",
    ffn_mult=1536 / 576,
    norm_type="rms",
    pe="rope",
    rope_base=100000.0,
    bias=False,
    vocab_size=49152 * 4 // 30,
    max_len=2048,
)

CASES = [
    # (label, model config, task lengths for evaluate, or (batch, tokens) of random text)
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
    ("smollm2-shaped, 4 x 128 tokens", SMOLLM2, (4, 128)),
    ("smollm2-shaped, 4 x 512 tokens", SMOLLM2, (4, 512)),
]


def timed(fn) -> float:
    """CPU seconds of this process (one thread): steadier than wall time on a shared machine."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def workload(model: Transformer, data):
    """The plain pass over a case's data: `evaluate` on the copy task, or one forward pass."""
    if isinstance(data, tuple):
        tokens = torch.randint(0, model.cfg.vocab_size, data, generator=torch.Generator())

        @torch.no_grad()
        def forward():
            model(tokens)

        return forward
    task = TaskConfig()
    return lambda: evaluate(model, task, data, batch_size=64, n_batches=2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default=None, help="run the cases whose label contains this")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"median CPU time of {args.repeats} interleaved runs"
    )
    print(
        f"{'case':34s} {'plain s':>8s} {'all stats':>10s} {'ratio':>6s} "
        f"{'entropy+p_max':>14s} {'ratio':>6s}"
    )
    for label, cfg, data in CASES:
        if args.only and args.only not in label:
            continue
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
        plain = workload(model, data)

        def observed(names=None, model=model, plain=plain):
            stats = AttentionStats(names)
            with model.observe(stats):
                plain()
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
            f"{med['subset'] / med['plain']:5.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
