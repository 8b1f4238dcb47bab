"""A heal run's resume state: `.probe-heal-state/` in its output directory, holding the student,
the optimizer's moments and the rows measured so far at the last save (`State`); `holding`,
which keeps a second run out of the folder while one writes it; and `clear_state`, which
removes only what heal wrote there.

A state that cannot be resumed (other settings, a damaged file) is never removed by the run
that refuses it: the message says so, and `--overwrite` (`clear_state`) is what discards it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from probe.errors import ProbeError
from probe.files import atomic_write, atomic_write_text
from probe.heal.config import HealConfig
from probe.weights import load_safetensors

STATE = ".probe-heal-state"  # the resume folder inside the output directory (heal's own name)
STATE_FILES = ("state.json", "student-*.safetensors", "optimizer-*.safetensors",
               ".*.probe-tmp")  # what heal writes there, and all it ever removes  # fmt: skip
DISCARD = "it is kept: pass --overwrite to discard it and start again"
STAGES = ("original", "pruned", "healed")
METRICS = ("loss", "perplexity")
LOSS_KEYS = ("step", "tokens", "lr", "kl", "hidden")


def state_folder(out: Path) -> Path:
    """`out`'s resume folder, refusing a file, a link or anything else of that name: heal
    writes only into a folder of its own (never through a link into someone else's)."""
    folder = Path(out) / STATE
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        kind = "a symbolic link" if folder.is_symlink() else "not a folder"
        raise ProbeError(f"{folder} is {kind}, so it is not heal's resume state; heal leaves it "
                         "alone: move it away, or choose another --out.")  # fmt: skip
    return folder


@contextlib.contextmanager
def holding(out: Path) -> Iterator[Path]:
    """Hold `out` for one heal run: the resume folder, made if missing, under an exclusive
    flock for the block (the kernel drops it when the process dies, so a killed run blocks
    nothing). A second run into the same `out` is one line. Yields the folder; removes it at
    the end when it is empty (nothing to resume)."""
    folder = state_folder(out)
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise ProbeError(f"cannot create the resume folder {folder}: "
                             f"{exc.strerror or exc}.") from None  # fmt: skip
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ProbeError(f"another `probe heal` is writing to {Path(out)}; wait for it to "
                             "finish, or choose another --out.") from None  # fmt: skip
        try:  # the run before may have removed the folder we opened: lock the one in place
            current = os.path.samestat(os.fstat(fd), os.stat(folder))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):  # empty: nothing saved, nothing to resume
            folder.rmdir()
        os.close(fd)


def clear_state(out: Path, keep_folder: bool = False) -> None:
    """Remove heal's resume state from `out` (only the files heal writes there); the folder
    too unless `keep_folder` (a run holding it, `holding`, starts again inside it)."""
    folder = Path(out) / STATE
    if not folder.is_dir() or folder.is_symlink():
        return
    for pattern in STATE_FILES:
        for path in folder.glob(pattern):
            if path.is_file():
                path.unlink(missing_ok=True)
    if not keep_folder:
        with contextlib.suppress(OSError):  # something else is in there: not heal's to remove
            folder.rmdir()


class State:
    """The resume folder: student-STEP.safetensors, optimizer-STEP.safetensors, and state.json
    (written last, naming the step), so a kill at any moment leaves a whole earlier state."""

    def __init__(self, out: Path, cfg: dict, identity: dict) -> None:
        self.folder, self.cfg, self.identity = Path(out) / STATE, cfg, identity

    def restore(self, student, optimizer, names, discard: bool = False) -> tuple[list, list, int]:
        """The rows, losses and step saved, with the student's weights and the optimizer's
        moments loaded from them; ([], [], 0) without a state. A state this run cannot resume
        (saved with other settings, damaged) is one line and stays, or with `discard`
        (--overwrite) is removed, and the run starts again; nothing is loaded from it."""
        try:
            return self._restore(student, optimizer, names)
        except ProbeError:
            if not discard:
                raise
            clear_state(self.folder.parent, keep_folder=True)
            return [], [], 0

    def _restore(self, student, optimizer, names) -> tuple[list, list, int]:
        folder = state_folder(self.folder.parent)
        path = folder / "state.json"
        if not path.is_file():
            return [], [], 0
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ProbeError(f"{path} cannot be read ({exc}); {DISCARD}.") from None
        if not isinstance(saved, dict):
            raise ProbeError(f"{path} is not a heal resume state; {DISCARD}.")
        for key, mine in (("config", self.cfg), ("identity", self.identity)):
            theirs = saved.get(key) if isinstance(saved.get(key), dict) else {}
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            if changed:
                raise ProbeError(
                    f"{folder} holds a heal run stopped at step {saved.get('step')} with other "
                    f"settings ({changed[0]}: {theirs.get(changed[0])!r}, now "
                    f"{mine.get(changed[0])!r}); give the same options to resume it, or pass "
                    "--overwrite to discard it and start again."
                )
        try:
            step, rows, losses, adam_steps = self._checked(saved)
            weights = load_safetensors(folder / f"student-{step}.safetensors", DISCARD)
            moments = load_safetensors(folder / f"optimizer-{step}.safetensors", DISCARD)
            moved = {}  # everything checked before anything is loaded into the run
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                name = names[id(p)]
                moved[p] = {
                    "step": torch.tensor(float(adam_steps[name])),
                    "exp_avg": _shaped(moments[f"exp_avg.{name}"], p),
                    "exp_avg_sq": _shaped(moments[f"exp_avg_sq.{name}"], p),
                }
            loaded = [(p, _shaped(weights[name], p)) for name, p in student.named_parameters()]
        except ProbeError as exc:
            raise ProbeError(f"{folder} holds a damaged resume state: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise ProbeError(f"{folder} holds a damaged resume state ({type(exc).__name__}: "
                             f"{exc}); {DISCARD}.") from None  # fmt: skip
        with torch.no_grad():
            for p, value in loaded:
                p.copy_(value)
        optimizer.state.update(moved)
        return rows, losses, step

    def _checked(self, saved: dict) -> tuple[int, list, list, dict]:
        """The saved step, rows, losses and Adam step counts, each what this run would have
        written by then (a save comes before the last step; one row a metric and stage
        measured; one loss a step), or a ProbeError saying which is not."""
        run = HealConfig(**self.cfg)  # the settings' own step arithmetic
        steps, step_tokens = run.steps, run.step_tokens
        step = saved.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step < steps:
            raise ProbeError(f"its step is {step!r}, not one of 1..{steps - 1} of this "
                             f"{steps}-step run; {DISCARD}")  # fmt: skip
        rows, losses, adam = saved.get("rows"), saved.get("losses"), saved.get("adam_steps")
        measured = [s for s in run.eval_steps if s <= step]
        want = {(stage, 0, m) for stage in STAGES[:2] for m in METRICS}
        want |= {("healed", s * step_tokens, m) for s in measured for m in METRICS}
        if not (isinstance(rows, list) and all(_row_ok(r) for r in rows)
                and len(rows) == len(want)
                and {(r["stage"], r["tokens"], r["metric"]) for r in rows} == want):  # fmt: skip
            raise ProbeError(f"its measured rows are not the {len(want)} rows (stage, "
                             f"tokens, metric, value) of steps 0 and {measured}; "
                             f"{DISCARD}")  # fmt: skip
        if not (isinstance(losses, list) and len(losses) == step
                and all(_loss_ok(r, i + 1) for i, r in enumerate(losses))):  # fmt: skip
            raise ProbeError(f"its losses are not one row of {', '.join(LOSS_KEYS)} for each "
                             f"of steps 1..{step}; {DISCARD}")  # fmt: skip
        if not isinstance(adam, dict) or not all(_number(v) for v in adam.values()):
            raise ProbeError(f"its optimizer step counts are not numbers; {DISCARD}")
        return step, rows, losses, adam

    def save(self, student, optimizer, names, rows, losses, step: int) -> None:
        from safetensors.torch import save_file

        state_folder(self.folder.parent).mkdir(parents=True, exist_ok=True)
        weights = {n: p.detach().cpu().contiguous() for n, p in student.named_parameters()}
        moments, adam_steps = {}, {}
        for p, st in optimizer.state.items():
            name = names[id(p)]
            moments[f"exp_avg.{name}"] = st["exp_avg"].detach().cpu().contiguous()
            moments[f"exp_avg_sq.{name}"] = st["exp_avg_sq"].detach().cpu().contiguous()
            adam_steps[name] = float(st["step"])
        document = {"config": self.cfg, "identity": self.identity, "step": step,
                    "adam_steps": adam_steps, "rows": rows, "losses": losses}  # fmt: skip
        written = [self.folder / f"{stem}-{step}.safetensors" for stem in ("student", "optimizer")]
        try:
            for path, tensors in zip(written, (weights, moments), strict=True):
                atomic_write(path, lambda tmp, t=tensors: save_file(t, str(tmp)))
            atomic_write_text(self.folder / "state.json", json.dumps(document) + "\n")
        except BaseException:  # a full disk, Ctrl-C: the earlier state stays whole, and alone
            if _saved_step(self.folder) != step:  # (a signal just after the rename: it is saved)
                for path in written:
                    path.unlink(missing_ok=True)
            raise
        for old in self.folder.glob("*-*.safetensors"):
            if not old.name.endswith(f"-{step}.safetensors"):
                old.unlink(missing_ok=True)


def _shaped(tensor: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`tensor` on `p`'s device and in its dtype, if it has `p`'s shape."""
    if tensor.shape != p.shape:
        raise ValueError(f"a saved tensor has shape {list(tensor.shape)}, not {list(p.shape)}")
    return tensor.to(device=p.device, dtype=p.dtype)


def _saved_step(folder: Path) -> int | None:
    """The step `folder`'s state.json names (None: none, or unreadable)."""
    try:
        return json.loads((folder / "state.json").read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return None


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _row_ok(row) -> bool:
    return (isinstance(row, dict) and set(row) == {"stage", "tokens", "metric", "value"}
            and row["stage"] in STAGES and row["metric"] in METRICS
            and isinstance(row["tokens"], int) and _number(row["value"]))  # fmt: skip


def _loss_ok(row, step: int) -> bool:
    return (isinstance(row, dict) and set(row) == set(LOSS_KEYS) and row["step"] == step
            and all(_number(row[k]) for k in LOSS_KEYS))  # fmt: skip
