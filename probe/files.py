"""Claiming outputs: every command checks where it will write before any work, creating nothing,
so a bad `--out` fails in one line at once, and no output is ever an input.

    earlier = claim_output(out, ("eval.csv",), overwrite, inputs=[checkpoint])
    ...                                  # the work
    open_output(out, earlier)            # then write
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from probe.errors import ProbeError

TMP_SUFFIX = ".probe-tmp"  # temporary files of atomic writes: `.NAME.XXXX.probe-tmp`


Inputs = Mapping[str, "str | Path"] | Iterable["str | Path | tuple[str, str | Path]"]
# what a command reads, by the option each path came from, so that a refusal names it:
# {"CHECKPOINT": ckpt, "--text": text} or [(option, path), ...]; a bare path is "the input"


def _labelled(inputs: Inputs) -> list[tuple[str, str | Path]]:
    items = inputs.items() if isinstance(inputs, Mapping) else inputs
    pairs = [item if isinstance(item, tuple) else ("the input", item) for item in items]
    return [(label, path) for label, path in pairs if path is not None]


def check_apart(out: str | Path, inputs: Inputs, what: str = "--out",
                inside_ok: bool = False) -> None:  # fmt: skip
    """`out` must not be an input, hold one, or (unless `inside_ok`: a results folder inside a
    checkpoint) lie inside one; symbolic links are followed, with or without --overwrite. The
    refusal names both options (`what` and the input's label)."""
    mine = _real(out)
    for label, given in _labelled(inputs):
        source = _real(given)
        if mine == source:
            relation = "is"
        elif source.is_relative_to(mine):
            relation = "holds"
        elif mine.is_relative_to(source) and not inside_ok:
            relation = "lies inside"
        else:
            continue
        link = "" if mine == Path(out).absolute() else f" (a link to '{mine}')"
        raise ProbeError(
            f"{what} '{out}'{link} {relation} {label} '{given}', which this command reads; "
            "write somewhere else (--overwrite never replaces an input)."
        )


def _real(path: str | Path) -> Path:
    """`path` absolute, with every symbolic link along it followed (it need not exist)."""
    return Path(path).expanduser().resolve(strict=False)


def check_output_dir(path: str | Path, what: str = "--out", inputs: Inputs = (),
                     inside_ok: bool = False) -> Path:  # fmt: skip
    """`path` can become an output directory: apart from the inputs, not a file or under one,
    and writable (or creatable under a writable folder). Creates nothing."""
    path = Path(path)
    check_apart(path, inputs, what, inside_ok)
    _check_folder(path, path, what)
    return path


class Claim(list[str]):
    """The files of `writes` an earlier run left in an output directory (what `open_output`
    removes, with --overwrite), remembering `writes`: any other of them found there when the
    results are written came from another run meanwhile."""

    def __init__(self, present: list[str], writes: tuple[str, ...]) -> None:
        super().__init__(present)
        self.writes = writes


def claim_output(path: str | Path, writes: tuple[str, ...], overwrite: bool = False,
                 what: str = "--out", inputs: Inputs = (),
                 inside_ok: bool = False) -> Claim:  # fmt: skip
    """Check an output directory before any work, creating nothing (`check_output_dir`), and
    that it holds none of the files in `writes` (names, or patterns with a `*`) unless
    `overwrite`. Returns the files of `writes` already there, for `open_output`."""
    path = check_output_dir(path, what, inputs, inside_ok)
    present = _matching(path, writes)
    if present and not overwrite:
        raise ProbeError(
            f"{what} '{path}' already holds {_listed(present)} from an earlier run; choose another "
            "directory or pass --overwrite to replace them."
        )
    return Claim(present, writes)


def _listed(names: list[str]) -> str:
    """The first four of `names` and how many more ("a, b, c, d and 3 more")."""
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return ", ".join(names[:4]) + more


def _matching(folder: Path, writes: tuple[str, ...]) -> list[str]:
    """The files of `writes` in `folder`; an entry with a `*` is a pattern (the shards of a
    model's weights: `model-*-of-*.safetensors`)."""
    found = []
    for name in writes:
        if "*" in name:
            found += sorted(p.name for p in folder.glob(name) if p.name not in found)
        elif (folder / name).exists() and name not in found:
            found.append(name)
    return found


def claim_file(path: str | Path, overwrite: bool = False, what: str = "--out",
               inputs: Inputs = (), inside_ok: bool = False) -> Path:  # fmt: skip
    """Check an output file before any work, creating nothing: apart from the inputs, not a
    directory, in a folder that is (or can be made) writable, and absent unless `overwrite`."""
    path = Path(path)
    check_apart(path, inputs, what, inside_ok)
    if path.is_dir():
        raise ProbeError(f"{what} '{path}' is a directory; give the name of a file to write.")
    kind = special_kind(path)
    if kind:  # a write is a rename onto it: --overwrite would replace /dev/null with a file
        raise ProbeError(f"{what} '{path}' is {kind}, not a regular file; give the name of a "
                         "file to write (--overwrite replaces only regular files).")  # fmt: skip
    _check_folder(path.parent, path, what)
    if path.exists() and not overwrite:
        raise ProbeError(f"{what} '{path}' exists; pass --overwrite to replace it.")
    return path


def _check_folder(folder: Path, given: Path, what: str) -> None:
    """`folder` (where `given` will be written) is a directory, or can be made under one, and
    is writable; the messages name `given`, the path the user typed."""
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            if parent == given:
                raise ProbeError(f"{what} '{given}' is a file; give a directory.")
            raise ProbeError(
                f"{what} '{given}' is under '{parent}', which is a file, not a folder; give a "
                "path in a directory."
            )
    _check_writable(folder, given, what)


def _check_writable(path: Path, given: Path, what: str) -> None:
    """Prove `path` can be written by writing there, leaving nothing behind: a temporary file
    in it when it exists, else the missing folders, made and removed again."""
    made, doing = [], f"writing in '{path}'"
    try:
        for folder in reversed([path, *path.parents]):
            if not folder.exists():
                doing = f"making the folder '{folder}'"
                try:
                    folder.mkdir()
                except FileExistsError:  # another process made it meanwhile: theirs to keep
                    continue
                made.append(folder)
        doing = f"writing in '{path}'"
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ProbeError(
            f"{what} '{given}' cannot be written: {doing} failed ({exc.strerror or exc})."
        ) from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:  # another process wrote into it meanwhile: leave it
                break


def open_output(path: str | Path, earlier: list[str]) -> Path:
    """Create the output directory and remove the files an earlier run left there (those
    `claim_output` found, with --overwrite), just before writing, so no directory mixes runs;
    refused when files of the same names arrived since the claim (two runs given one --out:
    the second to finish would silently replace, or mix with, the first's results)."""
    path = Path(path)
    arrived = [n for n in _matching(path, earlier.writes) if n not in earlier] if (
        isinstance(earlier, Claim) and path.is_dir()) else []  # fmt: skip
    if arrived:
        raise ProbeError(
            f"'{path}' received {_listed(arrived)} from another run while this one worked; "
            "nothing was written: run again with another --out, or with --overwrite once that "
            "run is done."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProbeError(f"cannot create '{path}': {exc.strerror or exc}.") from None
    for name in earlier:
        (path / name).unlink(missing_ok=True)
    return path


_SPECIAL = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def special_kind(path: str | Path) -> str | None:
    """What `path` is when it is a named pipe, a device or a socket (links followed), in words;
    None for anything else (a regular file, a folder, nothing)."""
    try:
        return _special(os.stat(path).st_mode)
    except OSError:
        return None


def _special(mode: int) -> str | None:
    """A file mode's kind in words when it is a named pipe, a device or a socket."""
    return next((kind for test, kind in _SPECIAL if test(mode)), None)


def check_input_file(path: str | Path, what: str) -> None:
    """`path`, an input about to be opened, is a regular file (links followed) when it exists:
    a folder, a named pipe, a device or a socket is one line naming it and `what` it should be
    ("the model's config.json"), before anything opens it (a FIFO blocks forever, /dev/zero
    never ends). A missing path is the caller's to report, in its own words."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a symbolic-link loop, a path under a file, no permission
        raise ProbeError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    if stat.S_ISDIR(mode):
        raise ProbeError(f"{path} is a directory; it should be {what}.")
    kind = _special(mode)
    if kind:
        raise ProbeError(f"{path} is {kind}, not a regular file; it should be {what}.")


@contextlib.contextmanager
def temporary_beside(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` (`.NAME.XXXX.probe-tmp`) for the block to write and then
    rename onto `path`; held under an flock meanwhile, so that the next write of `path` removes
    what a killed run left (the temporaries of that name whose lock is free, a whole model's
    size for a GGUF export) and never one a live run is writing. Removed if the block fails."""
    path = Path(path)
    for old in path.parent.glob(f".{glob_escape(path.name)}.*{TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            fd = os.open(old, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                old.unlink()
            except BlockingIOError:
                pass  # a run writing it now
            finally:
                os.close(fd)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    tmp = Path(name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def glob_escape(name: str) -> str:
    """`name` with the characters glob reads as patterns taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` a temporary file beside `path`, then `publish` it onto `path`; the
    temporary file is removed if anything fails (a reader sees the old file or the new one)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def publish(tmp: Path, path: Path) -> None:
    """Sync the written temporary file `tmp`, make it readable by all (mkstemp makes files
    private; results are meant to be shared) and rename it onto `path`."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` (its folder made if missing) through a temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# numpy's short write (`tofile`, under gguf's writer: "N requested and M written") has no errno
_NO_SPACE_WORDS = re.compile(
    r"No space left on device|Disk quota exceeded|\d+ requested and \d+ written"
)


def no_space(exc: BaseException) -> str | None:
    """One line for an exception that is, or came from, a write that found the disk (or the
    quota) full, whatever library raised it (OSError, safetensors' SafetensorError, numpy);
    None for anything else. Every probe write goes through a temporary file, so what a
    command finished before stays, and nothing half-written is left."""
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "errno", None)
        if code in _NO_SPACE or _NO_SPACE_WORDS.search(str(seen)):
            why = os.strerror(code) if code in _NO_SPACE else str(seen)
            return (
                f"a write failed because the disk is full ({why}); free some space or "
                "write elsewhere (--out), then run the command again (what was finished "
                "before is kept, nothing half-written is)."
            )
        seen = seen.__cause__ or seen.__context__
    return None
