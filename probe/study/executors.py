"""Where a study's cells run: in this process or a local process pool (`runner.py`), or as
tasks on a Ray cluster (`run_on_ray`).

On Ray each uncached cell is one task declaring what it needs (one CPU, or one GPU when the study
runs on CUDA). It writes its cell into the results directory exactly as a local worker does, so
the directory must be reachable from every node (the local disk of a one-machine cluster, or a
shared filesystem on a real one); the driver gathers the finished cells into the same manifest
and cache. A task whose worker process dies is run again (up to `RETRIES` times); an error in the
cell itself (bad input, divergence) is not retried. Ray is optional: `pip install 'probe[ray]'`.

Joining a cluster at HOST:PORT is bounded: `check_ray` first connects to the port (nothing
listening fails in at most CONNECT_S), and `ray.init` itself must return within INIT_S.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe import provenance
from probe.errors import ProbeError

RETRIES = 3  # runs of a cell whose worker process died
CONNECT_S = 3.0  # how long the cluster's port may take to accept a connection
INIT_S = 30.0  # how long joining the cluster may take once its port answers
NAMED = ("auto", "local")  # addresses Ray resolves itself: the cluster running here, a new one


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise ProbeError(
            "--executor ray needs Ray, which is not installed: pip install 'probe[ray]' (or "
            "pip install ray), or run with the local executor (the default)."
        ) from None
    return ray


def check_ray(address: str | None) -> None:
    """Fail now, in one line, when Ray is missing or nothing answers at `address` (HOST:PORT,
    or ray://HOST:PORT for Ray Client; 'auto', 'local' and None are Ray's to find)."""
    _ray()
    if address is None or address in NAMED:
        return
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ProbeError(
            f"--address {address}: nothing answers at {host}:{port} ({reason}); start the Ray "
            "cluster there (ray start --head) or give the address it printed."
        ) from None


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProbeError(
            f"--address '{address}' is not HOST:PORT (a port from 1 to 65535), ray://HOST:PORT, "
            "'auto' or 'local'."
        )
    return host, int(port)


def _join(ray: Any, address: str | None, **options: Any) -> None:
    """ray.init, bounded by INIT_S when joining a cluster at an address (ray.init alone can wait
    for ever for a port that accepts but is not Ray's)."""
    if address is None or address in NAMED:
        ray.init(**({"address": address} if address else {}), **options)
        return
    check_ray(address)
    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=address, **options)
        except BaseException as exc:  # re-raised below, in the caller's thread
            failure.append(exc)

    joining = threading.Thread(target=init, name="ray-init", daemon=True)
    joining.start()
    joining.join(INIT_S)
    if joining.is_alive():
        raise ProbeError(
            f"--address {address}: the port answers but no Ray cluster joined within "
            f"{INIT_S:.0f} s; check that it is a Ray cluster's address (ray status there)."
        )
    if failure and isinstance(failure[0], ConnectionError):
        said = " ".join(str(failure[0]).split())
        raise ProbeError(f"--address {address}: Ray could not join it ({said}).") from None
    if failure:
        raise failure[0]


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
        _join(ray, address, include_dashboard=False, log_to_driver=False,
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
