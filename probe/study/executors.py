"""Where a study's cells run: in this process or a local process pool (`runner.py`), or as
tasks on a Ray cluster (`run_on_ray`).

On Ray each uncached cell is one task declaring what it needs (one CPU, or one GPU when the study
runs on CUDA). It writes its cell into the results directory exactly as a local worker does, so
the directory must be reachable from every node (the local disk of a one-machine cluster, or a
shared filesystem on a real one); the driver gathers the finished cells into the same manifest
and cache. A task whose worker process dies is run again (up to `RETRIES` times); an error in the
cell itself (bad input, divergence) is not retried. Ray is optional: `pip install 'probe[ray]'`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe import provenance
from probe.errors import ProbeError

RETRIES = 3  # runs of a cell whose worker process died


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise ProbeError(
            "--executor ray needs Ray, which is not installed: pip install 'probe[ray]' (or "
            "pip install ray), or run with the local executor (the default)."
        ) from None
    return ray


def _run_cell_task(cell, root: str, device: str, threads: int):
    """One cell in a Ray worker (progress events are not relayed; the driver counts cells)."""
    import torch

    from probe.study.cells import run_cell

    torch.set_num_threads(threads)
    return run_cell(cell, Path(root), device, lambda event: None)


def run_on_ray(
    todo,
    out: Path,
    device: str,
    threads: int,
    address: str | None,
    started: Callable[[Any], None],
    finished: Callable[[Any], None],
) -> None:
    """Run the cells of `todo` as Ray tasks and call `finished(record)` as each completes."""
    ray = _ray()
    if not ray.is_initialized():
        options = {"address": address} if address else {}
        ray.init(**options, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)  # fmt: skip
    gpu = str(device).startswith("cuda")
    env = {provenance.PIN: os.environ.get(provenance.PIN, "") or provenance.git_commit() or ""}
    task = ray.remote(_run_cell_task).options(
        num_cpus=0 if gpu else threads, num_gpus=1 if gpu else 0, max_retries=RETRIES,
        retry_exceptions=False, runtime_env={"env_vars": env},
    )  # fmt: skip
    pending = {}
    for cell in todo:
        pending[task.remote(cell, str(Path(out).resolve()), device, threads)] = cell
        started(cell)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                cell = pending.pop(ref)
                try:
                    finished(ray.get(ref))
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.as_instanceof_cause()
                    if isinstance(cause, ProbeError):
                        raise ProbeError(f"{cell.label}: {cause}") from None
                    raise
                except ray.exceptions.WorkerCrashedError:
                    raise ProbeError(
                        f"{cell.label}: its Ray worker died {RETRIES + 1} times; the finished "
                        "cells are kept, run the study again to retry it."
                    ) from None
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
