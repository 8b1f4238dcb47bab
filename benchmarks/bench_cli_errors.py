"""Benchmark: how fast a plain mistake is answered, against `probe --help`, as ratios measured
side by side in one run (the runs alternate, so a busy machine slows both alike).

Each mistake is checked before torch is imported (probe_cli.common's parameter callbacks, then
each command's own checks and --out claim): its wall time should be that of `probe --help`,
not that of importing torch and loading a model.

- `probe prune nowhere --out x`: a checkpoint that is not there;
- `probe prune CKPT --fraction 1.5 --out x`: an option out of range on a real checkpoint;
- `probe study run studies/quikstart.toml`: a typo'd study file;
- `probe train --task cpoy --out x`: an unknown task name;
- `probe prune CKPT` (no --out): a usage error;
- `python -c "import torch"`: what importing torch alone costs here, for scale.

    .venv/bin/python benchmarks/bench_cli_errors.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.train_config import TrainConfig

PROBE = [sys.executable, "-m", "probe_cli"]


def wall(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-cli-errors-"))
    try:
        task = TaskConfig(name="copy", n_symbols=4)
        cfg = ModelConfig(vocab_size=task.vocab_size, n_layer=1, n_head=2, d_model=16)
        ckpt = str(root / "ckpt")
        save_checkpoint(ckpt, Transformer(cfg), task, TrainConfig(train_len=(2, 4)), {})
        out = str(root / "out")
        cases = {
            "probe --help": [*PROBE, "--help"],
            "prune nowhere --out x": [*PROBE, "prune", "nowhere", "--out", out],
            "prune CKPT --fraction 1.5": [*PROBE, "prune", ckpt, "--fraction", "1.5", "--out", out],
            "study run <typo>.toml": [*PROBE, "study", "run", "studies/quikstart.toml"],
            "train --task cpoy": [*PROBE, "train", "--task", "cpoy", "--out", out],
            "prune CKPT (no --out)": [*PROBE, "prune", ckpt],
            "import torch (for scale)": [sys.executable, "-c", "import torch"],
        }  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):  # alternating: each round runs every case once
            for name, command in cases.items():
                times[name].append(wall(command, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    reference = medians["probe --help"]
    print(f"median wall time of {args.repeats} alternating runs (torch {torch.__version__})")
    for name, median in medians.items():
        print(f"{name:28s} {median:6.2f} s   x{median / reference:5.2f} of probe --help")


if __name__ == "__main__":
    main()
