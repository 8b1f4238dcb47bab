"""Benchmark: the study runner's overheads and speed-ups, as ratios measured in one process.

- cached rerun / first run: what a rerun of a finished study costs (reading done.json files and
  gathering the tables) against running it;
- --jobs 2 / --jobs 1: wall time of the same cells in two processes against one;
- threads 2 / threads 1 per cell: why the runner defaults to one torch thread per cell.

    .venv/bin/python benchmarks/bench_study.py [--steps 150]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import tomllib
from pathlib import Path

from probe.study.grid.spec import parse_study
from probe.study.runner import run_study

STUDY = """
[study]
name = "bench"
question = "How fast is the runner?"
[base.model]
n_layer = 2
n_head = 4
d_model = 64
max_len = 64
[base.task]
name = "copy"
[base.train]
steps = STEPS
batch_size = 32
train_len = [2, 8]
eval_every = 0
[grid]
model.pe = ["learned", "rope"]
train.seed = [0, 1]
[analysis.eval_lengths]
lengths = "1:2L"
"""


def timed(study, out: Path, **kwargs) -> float:
    start = time.perf_counter()
    run_study(study, out, device="cpu", **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    study = parse_study(tomllib.loads(STUDY.replace("STEPS", str(args.steps))), None)
    root = Path(tempfile.mkdtemp(prefix="bench-study-"))
    try:
        one = timed(study, root / "one", jobs=1, threads=1)
        cached = timed(study, root / "one", jobs=1, threads=1)
        two_threads = timed(study, root / "threads", jobs=1, threads=2)
        two_jobs = timed(study, root / "jobs", jobs=2, threads=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"4 cells of a 2x64 decoder, {args.steps} steps each")
    print(f"first run, 1 job, 1 thread:  {one:7.2f} s")
    print(f"cached rerun / first run:    {cached / one:7.3f}")
    print(f"threads 2 / threads 1:       {two_threads / one:7.2f}  (wall time, 1 job)")
    print(f"jobs 2 / jobs 1:             {two_jobs / one:7.2f}  (wall time, 1 thread per job)")


if __name__ == "__main__":
    main()
