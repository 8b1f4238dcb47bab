"""What a result depends on: package versions, git commit, device, date."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

PACKAGES = ("probe", "torch", "numpy", "pandas", "scipy", "safetensors")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


PIN = "PROBE_GIT_COMMIT"  # set while a study runs: what its cells' code was loaded from


def git_commit(start: Path | None = None) -> str | None:
    """The commit of the git checkout holding probe (None outside one); '+dirty' if its code
    (anything outside results/) differs from that commit. While a study runs, the commit it
    started from (`pinned`): its processes keep the code they loaded even if HEAD moves."""
    pinned = os.environ.get(PIN)
    if pinned and start is None:
        return pinned
    return _read_git(start or Path(__file__).resolve().parent)


@contextmanager
def pinned(commit: str | None) -> Iterator[None]:
    """git_commit() returns `commit` inside the block, here and in processes started in it."""
    before = os.environ.get(PIN)
    if commit:
        os.environ[PIN] = commit
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PIN, None)
        else:
            os.environ[PIN] = before


def _read_git(where: Path) -> str | None:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            # outputs under results/ do not make the code dirty
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(top,exclude)results",
            ],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device) -> str:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    unit = "thread" if threads == 1 else "threads"
    return f"cpu ({platform.processor() or platform.machine()}, {threads} {unit})"


def context(device="cpu", model=None) -> dict:
    """Everything recorded next to a result: with a `model`, the device and dtype its weights
    are held in (`runtime`), else the `device` given."""
    from probe.runtime import Runtime

    runtime = Runtime.resolve(device).record(model)
    return {
        "versions": versions(),
        "git_commit": git_commit(),
        "device": device_name(runtime["device"]),
        "runtime": runtime,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
