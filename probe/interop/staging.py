"""All of an import's (or export's) files at once, or none: they are written into a folder
`OUT/.probe-stage-XXXX.probe-tmp` and moved into OUT only when every one is complete, so a run
that is interrupted or killed leaves no half output and the same command can simply run again.

Each staging folder is locked (`flock`) by the run writing it; a later run into the same OUT
removes the staging folders whose run has died (the lock is free), and nothing else.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from probe.errors import Interrupted, ProbeError
from probe.files import TMP_SUFFIX

CONFIG = "config.json"  # a model folder's config (probe's or HF's): its presence marks it whole
PREFIX = ".probe-stage-"
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _lock(folder: Path, wait: bool) -> int | None:
    """A file descriptor holding `folder`'s lock, or None when another process holds it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def clean_stale(out: Path) -> list[Path]:
    """Remove the staging folders in `out` that no live run holds; returns them."""
    removed = []
    for folder in sorted(out.glob(f"{PREFIX}*{TMP_SUFFIX}")):
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            fd = _lock(folder, wait=False)
        except OSError:
            continue
        if fd is None:
            continue  # a run writing now
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def _commit(stage: Path, out: Path, earlier: list[str]) -> None:
    """Move the staged files into `out` (config.json last: it makes the folder a checkpoint) and
    remove the files of an earlier run that this one does not write; Ctrl-C waits until done."""
    written = sorted((p.name for p in stage.iterdir() if p.is_file()), key=lambda n: n == CONFIG)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        for name in earlier:
            if name not in written:
                (out / name).unlink(missing_ok=True)
        for name in written:
            os.replace(stage / name, out / name)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextmanager
def staged(out: Path, earlier: list[str]) -> Iterator[Path]:
    """A folder to write `out`'s files into; they replace `out`'s (and `earlier`, the files an
    earlier run left, as `claim_output` found them) only when the block completes."""
    out = Path(out)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        clean_stale(out)
        stage = Path(tempfile.mkdtemp(prefix=PREFIX, suffix=TMP_SUFFIX, dir=out))
    except OSError as exc:
        raise ProbeError(f"cannot write into '{out}': {exc.strerror or exc}.") from None
    fd = _lock(stage, wait=True)
    try:
        yield stage
        _commit(stage, out, earlier)
    except (KeyboardInterrupt, Interrupted):
        raise Interrupted(f"nothing was written to '{out}'; run the same command again") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if fd is not None:
            os.close(fd)
        if created and not any(out.iterdir()):
            out.rmdir()
