"""Wall time of one smoke study run sequentially, with --jobs 2 and on a local Ray instance
(two CPUs), side by side in one process, each into a fresh folder (nothing cached).

    .venv/bin/python benchmarks/bench_executors.py [studies/positions.toml] [--full]

Prints the seconds and the speed-ups over the sequential run."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from probe.study.grid.cells import expand as run_cells
from probe.study.grid.spec import load_study, smoke_version
from probe.study.runner import run_study


def timed(study, out: Path, **options) -> float:
    start = time.perf_counter()
    run_study(study, out, **options)
    return time.perf_counter() - start


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--full"]
    full = "--full" in sys.argv[1:]
    path = Path(args[0] if args else "studies/positions.toml")
    study = load_study(path) if full else smoke_version(load_study(path))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seconds = {"sequential": timed(study, root / "seq")}
        seconds["--jobs 2"] = timed(study, root / "jobs", jobs=2)
        try:
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            seconds["ray (2 CPUs)"] = timed(study, root / "ray", executor="ray")
            ray.shutdown()
        except ModuleNotFoundError:
            print("ray is not installed: pip install 'probe[ray]'")
    base = seconds["sequential"]
    kind = "full" if full else "smoke"
    print(f"{path} ({kind}, {len(run_cells(study))} cells): from scratch")
    for name, s in seconds.items():
        print(f"  {name:14s} {s:7.1f} s   speed-up {base / s:4.2f}x")


if __name__ == "__main__":
    main()
