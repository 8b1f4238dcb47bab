"""Which processes are alive, and whose children they are: psutil when it is installed, else
/proc (Linux)."""

from __future__ import annotations

import time
from pathlib import Path

try:
    import psutil
except ModuleNotFoundError:  # pragma: no cover - depends on the machine
    psutil = None


def children(pid: int) -> list[int]:
    """The pids of `pid`'s direct children."""
    if psutil is not None:
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.NoSuchProcess:
            return []
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, is not alive)."""
    if psutil is not None:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(condition, seconds: float, step: float = 0.1) -> bool:
    """Poll `condition` until it holds or `seconds` have passed; whether it held."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below `folder` (its path) with its size and modification time in ns: two
    snapshots differ when anything was written there in between."""
    return {str(f): (f.stat().st_size, f.stat().st_mtime_ns) for f in folder.rglob("*")
            if f.is_file()}  # fmt: skip
