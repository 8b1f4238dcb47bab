"""Running one command in N processes (`probe train --nproc N`, `probe importance --nproc N`),
and tying each of those processes to the one that started it.

`launch` starts rank 0..N-1 of the command itself, with the environment torchrun gives its
workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; one OpenMP thread each unless
OMP_NUM_THREADS says otherwise), so no agent process sits between the launcher and the ranks. It
waits for them, stops the others as soon as one fails (a rank blocked in a collective would
otherwise wait for its dead peer), and returns the first failure: its rank, exit status and what
it wrote on stderr. `check_process_count` refuses, before anything starts, more processes than
the machine can hold.

A rank dies with its parent, whoever started it (this launcher, or torchrun's agent when run by
hand): `tie_to_parent`, called as a rank starts, asks Linux to kill it when its parent dies
(PR_SET_PDEATHSIG), then checks that the parent is still the one expected (it may have died
before the request), and starts a watchdog thread that ends the process when its parent changes
(the same on platforms without prctl).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from probe.errors import Interrupted, ProbeError
from probe.measure.memory import check_fits

LAUNCHER = "PROBE_LAUNCHER_PID"  # the launcher's pid, for its ranks' check of their parent
MODULE = "probe_cli.main"  # what each rank runs: the `probe` command line
RANK_BYTES = 400 * 2**20  # memory of one more Python process with torch loaded, about
POLL_S = 0.05  # how often the launcher looks at its ranks
WATCH_S = 0.5  # how often a rank's watchdog looks at its parent
GRACE_S = 5.0  # how long a rank asked to stop may take before it is killed
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCHDOG = "probe-parent-watchdog"


@dataclass(frozen=True)
class Outcome:
    """How the ranks ended: code 0 when every rank succeeded, else the status of the rank that
    failed first (negative: killed by that signal), with what that rank wrote on stderr."""

    code: int
    rank: int
    stderr: str


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_process_count(nproc: int, device: torch.device, oversubscribe: bool = False) -> None:
    """Refuse `nproc` processes the machine cannot hold: more than its GPUs on CUDA (one GPU per
    rank), more than its CPU cores on the CPU unless `oversubscribe`, and never more than its
    memory holds."""
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise ProbeError(
                f"--nproc {nproc} on CUDA needs one GPU per process, but torch sees {gpus}; use "
                f"--nproc {gpus} or fewer, or --device cpu."
            )
    else:
        cores = cpu_cores()
        if nproc > cores and not oversubscribe:
            raise ProbeError(
                f"--nproc {nproc} is more processes than the {cores} CPU cores here; use "
                f"--nproc {cores} or fewer, or pass --oversubscribe to start them anyway."
            )
    check_fits(nproc * RANK_BYTES, f"--nproc {nproc} (each process loads torch)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(stream, into: list[bytes]) -> None:
    for line in stream:
        into.append(line)
    stream.close()


def _stop(procs: Sequence[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    """Ask the ranks still running to stop (they clean up what they were writing), then kill
    those that do not within GRACE_S."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(sig)
    deadline = time.monotonic() + GRACE_S
    for p in alive:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _settle(procs: Sequence[subprocess.Popen], seconds: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)


def _first_failure(codes: Sequence[int | None]) -> int | None:
    """The rank to report among those that have failed: the first with a user error (status 2),
    as the others often failed only because that rank left."""
    failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
    if not failed:
        return None
    return next((r for r in failed if codes[r] == 2), failed[0])


def launch(args: Sequence[str], nproc: int, module: str = MODULE) -> Outcome:
    """Run `python -m MODULE ARGS...` (`probe ARGS...`) as ranks 0..nproc-1 of one process
    group on this machine and wait for them; rank 0's standard output is this process's."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
            LAUNCHER: str(os.getpid())}  # fmt: skip
    base.setdefault("OMP_NUM_THREADS", "1")
    procs: list[subprocess.Popen] = []
    errs: list[list[bytes]] = []
    readers = []
    try:
        for rank in range(nproc):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            p = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                 stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 stdout=None if rank == 0 else subprocess.DEVNULL)  # fmt: skip
            procs.append(p)
            errs.append([])
            readers.append(threading.Thread(target=_read, args=(p.stderr, errs[-1]), daemon=True))
            readers[-1].start()
        while True:
            codes = [p.poll() for p in procs]
            failed = _first_failure(codes)
            if all(c == 0 for c in codes):
                break
            if failed is not None:  # the others stop too, some with errors of their own:
                _settle(procs)  # a moment for them to say why, to report the most telling
                codes = [p.poll() for p in procs]
                failed = _first_failure(codes)
                break
            time.sleep(POLL_S)
    except (KeyboardInterrupt, Interrupted):
        _settle(procs)  # Ctrl-C reached the ranks too: let them stop on their own first
        _stop(procs)  # each rank says what it kept; rank 0's words are the ones that count
        for t in readers:
            t.join()
        return Outcome(130, 0, b"".join(errs[0]).decode(errors="replace") if errs else "")
    finally:
        _stop(procs)
    for t in readers:
        t.join()
    rank = failed if failed is not None else 0
    return Outcome(codes[rank] or 0, rank, b"".join(errs[rank]).decode(errors="replace"))


def tie_to_parent(parent: int | None = None) -> None:
    """Make this process (a rank) die with its parent: the kernel's parent-death signal where
    there is one, and a watchdog thread everywhere. The parent expected is `parent`, else the
    launcher that named itself in PROBE_LAUNCHER_PID (removed here, so processes this one starts
    do not inherit it), else the current one; if it has already gone, exit now."""
    named = os.environ.pop(LAUNCHER, "")
    if parent is None:
        parent = int(named) if named.isdigit() else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still ties it
    if os.getppid() != parent:  # the parent died before the request: nobody waits for this one
        os._exit(1)
    if not any(t.name == WATCHDOG for t in threading.enumerate()):
        threading.Thread(target=_watch, args=(parent,), name=WATCHDOG, daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(1)
