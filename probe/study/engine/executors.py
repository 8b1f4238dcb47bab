"""Where units run: in this process, in a pool of local processes, or as tasks on a Ray cluster.

On Ray each unit is one task declaring what it needs (one CPU per thread, or one GPU when the
study runs on CUDA). It writes its unit into the results directory exactly as a local worker
does, so the directory must be reachable from every node (the local disk of a one-machine
cluster, or a shared filesystem on a real one); the driver gathers the finished units into the
same manifest and cache. A task whose worker process dies is run again (up to `RETRIES` times);
an error in the unit itself (bad input, divergence) is not retried. Ray is optional:
`pip install 'probe[ray]'`.

Joining a cluster at HOST:PORT is bounded: `check_ray` first connects to the port (nothing
listening fails in at most CONNECT_S), and `ray.init` itself must return within INIT_S.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

import torch

from probe import provenance
from probe.errors import ProbeError, optional
from probe.study.engine.compute import compute, relayed, worker_context
from probe.study.engine.units import Plan, Record, Settings, Unit
from probe.training.launch import tie_to_parent

RETRIES = 3  # runs of a unit whose worker process died
CONNECT_S = 3.0  # how long the cluster's port may take to accept a connection
INIT_S = 30.0  # how long joining the cluster may take once its port answers
NAMED = ("auto", "local")  # addresses Ray resolves itself: the cluster running here, a new one

Begun = Callable[[Unit], None]
Relay = Callable[[tuple], None]  # (index, phase, done, total, note)
Finished = Callable[[Record], None]


def run_here(plan: Plan, todo: list[Unit], context: Any, begun: Begun, relay: Relay,
             finished: Finished) -> None:  # fmt: skip
    for unit in todo:
        begun(unit)
        finished(compute(plan, unit, context, relayed(unit.index, relay)))


def _worker_init(threads: int, parent: int) -> None:
    tie_to_parent(parent)  # kill -9 of the run ends its workers too: none goes on writing units
    torch.set_num_threads(threads)


def _in_worker(plan: Plan, unit: Unit, events: Any) -> Record:
    return compute(plan, unit, worker_context(plan), relayed(unit.index, events.put))


def run_pool(plan: Plan, todo: list[Unit], settings: Settings, begun: Begun, relay: Relay,
             finished: Finished) -> None:  # fmt: skip
    """Up to `settings.jobs` units at once, each in a process of a local pool (spawned: torch
    and forks do not mix); every worker builds the plan's context once."""
    context = mp.get_context("spawn")
    by_index = {unit.index: unit for unit in todo}
    me = os.getpid()
    manager = SyncManager(ctx=context)
    manager.start(tie_to_parent, (me,))  # the progress relay dies with the run, as workers do
    with (
        manager,
        ProcessPoolExecutor(max_workers=settings.jobs, mp_context=context,
                            initializer=_worker_init, initargs=(settings.threads, me)) as pool,
    ):  # fmt: skip
        events = manager.Queue()
        pending = {pool.submit(_in_worker, plan, unit, events): unit for unit in todo}
        started: set[int] = set()
        try:
            while pending:
                done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                while True:
                    try:
                        event = events.get_nowait()
                    except queue.Empty:
                        break
                    if event[0] not in started:
                        started.add(event[0])
                        begun(by_index[event[0]])
                    relay(event)
                for future in done:
                    unit = pending.pop(future)
                    if unit.index not in started:
                        started.add(unit.index)
                        begun(unit)
                    finished(future.result())
        except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: stop the workers too
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            raise


def _ray() -> Any:
    return optional("ray", "--executor ray", ", or run with the local executor (the default).")


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


def _ray_task(plan: Plan, unit: Unit, threads: int) -> Record:
    """One unit in a Ray worker (progress inside it is not relayed; the driver counts units)."""
    torch.set_num_threads(threads)
    return compute(plan, unit, worker_context(plan), lambda *event: None)


def run_on_ray(plan: Plan, todo: list[Unit], settings: Settings, begun: Begun,
               finished: Finished) -> None:  # fmt: skip
    """Run the units of `todo` as Ray tasks and call `finished(record)` as each completes."""
    ray = _ray()
    if not ray.is_initialized():
        _join(ray, settings.address, include_dashboard=False, log_to_driver=False,
              ignore_reinit_error=True)  # fmt: skip
    gpu = str(settings.device).startswith("cuda")
    env = {provenance.PIN: os.environ.get(provenance.PIN, "") or provenance.git_commit() or ""}
    task = ray.remote(_ray_task).options(
        num_cpus=0 if gpu else settings.threads, num_gpus=1 if gpu else 0, max_retries=RETRIES,
        retry_exceptions=False, runtime_env={"env_vars": env},
    )  # fmt: skip
    plan.root = Path(plan.root).resolve()  # the workers' view of the results directory
    pending = {}
    for unit in todo:
        pending[task.remote(plan, unit, settings.threads)] = unit
        begun(unit)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                unit = pending.pop(ref)
                try:
                    finished(ray.get(ref))
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause  # the unit's own error (str() of exc is Ray's traceback)
                    if isinstance(cause, ProbeError):
                        raise ProbeError(str(cause)) from None
                    raise
                except ray.exceptions.WorkerCrashedError:
                    raise ProbeError(
                        f"{unit.label}: its Ray worker died {RETRIES + 1} times; the finished "
                        f"{plan.noun}s are kept, run the study again to retry it."
                    ) from None
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
