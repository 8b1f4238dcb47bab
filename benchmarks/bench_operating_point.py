"""Benchmark: a head study's pruned model at its operating point against the original, forward
tokens/s measured side by side in one run.

The operating point is read from a finished head study (`results/NAME/operating_points.csv`):
the curve method that removes the most heads in every seed while the primary metric stays within
the study's tolerance. That method's ranking on seed 0's text prunes the model physically (as the
study's timing step does), and both models are timed in turn on rows of the study's text.

    .venv/bin/python benchmarks/bench_operating_point.py [studies/smollm2-heads.toml]
        [--results results/smollm2-heads] [--repeats 5] [--threads 1] [--batch-sizes 1,8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
from bench_imported import interleaved  # same folder: median of turns

from probe.measure.evaluate import forward_batch
from probe.study.heads.steps.timing import pruned_model
from probe.study.heads.subject import Subject
from probe.study.kinds import load_any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", nargs="?", default="studies/smollm2-heads.toml")
    parser.add_argument("--results", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-sizes", default="1,8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    study = load_any(args.study)
    results = Path(args.results or f"results/{study.name}")
    ops = pd.read_csv(results / "operating_points.csv")
    ops = ops[(ops.method != "random") & (ops.unit == "head")]
    best = ops.sort_values(["min_fraction", "max_fraction"], ascending=False).iloc[0]
    subject = Subject(study)
    model = subject.model
    pruned = pruned_model(subject, best.method, best.unit, int(best.min_heads))
    longest = max(subject.splits[1], key=lambda b: b.inputs.shape[1])
    n_heads = sum(m.n_kept for m in model.attention_modules())
    print(f"{study.name}: {best.method} removes {int(best.min_heads)} of {n_heads} heads "
          f"(operating point, tolerance {study.operating.tolerance}); "
          f"{args.threads} thread(s), {args.repeats} repeats")  # fmt: skip
    for size in (int(s) for s in args.batch_sizes.split(",")):
        idx = torch.arange(size) % longest.inputs.shape[0]
        batch = type(longest)(longest.inputs[idx], longest.targets[idx], longest.loss_mask[idx],
                              None, longest.length)  # fmt: skip
        fns = {"original": lambda b=batch: forward_batch(model, b),
               "pruned": lambda b=batch: forward_batch(pruned, b)}  # fmt: skip
        t = interleaved(fns, args.repeats)
        tokens = batch.inputs.numel()
        print(f"batch {size} x {batch.inputs.shape[1]}: original {tokens / t['original']:.0f} "
              f"tokens/s, pruned {tokens / t['pruned']:.0f} tokens/s: "
              f"{t['original'] / t['pruned']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
