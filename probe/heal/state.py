"""A heal run's resume state: `.probe-heal-state/` in its output directory, holding the student,
the optimizer's moments and the rows measured so far at the last save (`State`), and
`clear_state`, which removes only what heal wrote there."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from probe.errors import ProbeError
from probe.files import atomic_write_text
from probe.weights import _atomic_write, load_safetensors

STATE = ".probe-heal-state"  # the resume folder inside the output directory (heal's own name)
STATE_FILES = ("state.json", "student-*.safetensors", "optimizer-*.safetensors",
               ".*.probe-tmp")  # what heal writes there, and all it ever removes  # fmt: skip


def clear_state(out: Path) -> None:
    """Remove heal's resume state from `out` (only the files heal writes there)."""
    folder = Path(out) / STATE
    if not folder.is_dir() or folder.is_symlink():
        return
    for pattern in STATE_FILES:
        for path in folder.glob(pattern):
            if path.is_file():
                path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something else is in there: not heal's to remove
        folder.rmdir()


class State:
    """The resume folder: student-STEP.safetensors, optimizer-STEP.safetensors, and state.json
    (written last, naming the step), so a kill at any moment leaves a whole earlier state."""

    def __init__(self, out: Path, cfg: dict, identity: dict) -> None:
        self.folder, self.cfg, self.identity = Path(out) / STATE, cfg, identity

    def restore(self, student, optimizer, names) -> tuple[list, list, int]:
        path = self.folder / "state.json"
        if not path.is_file():
            return [], [], 0
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ProbeError(f"{path} cannot be read ({exc}); pass --overwrite to start "
                             "again.") from None  # fmt: skip
        if not isinstance(saved, dict):
            raise ProbeError(f"{path} is not a heal resume state; pass --overwrite to start "
                             "again.")  # fmt: skip
        for key, mine in (("config", self.cfg), ("identity", self.identity)):
            theirs = saved.get(key) if isinstance(saved.get(key), dict) else {}
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            if changed:
                raise ProbeError(
                    f"{self.folder.parent} holds a heal run stopped at step {saved.get('step')} "
                    f"with other settings ({changed[0]}: {theirs.get(changed[0])!r}, now "
                    f"{mine.get(changed[0])!r}); give the same options to resume it, or pass "
                    "--overwrite to start again."
                )
        advice = "pass --overwrite to start again"
        try:
            step = int(saved["step"])
            weights = load_safetensors(self.folder / f"student-{step}.safetensors", advice)
            moments = load_safetensors(self.folder / f"optimizer-{step}.safetensors", advice)
            with torch.no_grad():
                for name, p in student.named_parameters():
                    p.copy_(weights[name])
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                name = names[id(p)]
                optimizer.state[p] = {
                    "step": torch.tensor(float(saved["adam_steps"][name])),
                    "exp_avg": moments[f"exp_avg.{name}"].to(p.device),
                    "exp_avg_sq": moments[f"exp_avg_sq.{name}"].to(p.device),
                }
            return list(saved["rows"]), list(saved["losses"]), step
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise ProbeError(
                f"{self.folder} holds a damaged resume state ({type(exc).__name__}: "
                f"{exc}); {advice}."
            ) from None

    def save(self, student, optimizer, names, rows, losses, step: int) -> None:
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        weights = {n: p.detach().cpu().contiguous() for n, p in student.named_parameters()}
        moments, adam_steps = {}, {}
        for p, st in optimizer.state.items():
            name = names[id(p)]
            moments[f"exp_avg.{name}"] = st["exp_avg"].detach().cpu().contiguous()
            moments[f"exp_avg_sq.{name}"] = st["exp_avg_sq"].detach().cpu().contiguous()
            adam_steps[name] = float(st["step"])
        for stem, tensors in (("student", weights), ("optimizer", moments)):
            path = self.folder / f"{stem}-{step}.safetensors"
            _atomic_write(path, lambda tmp, t=tensors: save_file(t, str(tmp)))
        document = {"config": self.cfg, "identity": self.identity, "step": step,
                    "adam_steps": adam_steps, "rows": rows, "losses": losses}  # fmt: skip
        atomic_write_text(self.folder / "state.json", json.dumps(document) + "\n")
        for old in self.folder.glob("*-*.safetensors"):
            if not old.name.endswith(f"-{step}.safetensors"):
                old.unlink(missing_ok=True)
