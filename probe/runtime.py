"""Where and in what a computation runs: one `Runtime` (device, dtype, threads, autocast),
resolved once from a command's options, passed down to every analysis, and recorded in every
manifest.

    runtime = Runtime.resolve(device="auto", dtype="bfloat16")
    ckpt = load_checkpoint(path, runtime=runtime)      # weights in runtime.dtype, on its device
    record = runtime.record(ckpt.model)                # what a manifest keeps

`dtype=None` keeps a checkpoint's own dtype (a bf16 import stays bf16). Statistics (entropy,
importance, Fisher, least squares, losses) accumulate in float32 whatever the weights' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.dtype_names import DTYPE_CHOICES, dtype_named
from probe.errors import ProbeError

CHOICES = "auto, cpu, cuda or cuda:N"

# the dtypes weights are held in, by the name a user types (and the one manifests record)
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
ACCUMULATE = torch.float32  # what statistics and losses are summed in, whatever the weights


def resolve_device(name: str | torch.device) -> torch.device:
    """`auto` -> the first CUDA GPU when torch sees one, else the CPU; `cpu`, `cuda`, `cuda:N`
    (and `mps` where it exists) as given, once checked to exist here."""
    if isinstance(name, torch.device):
        name = str(name)
    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ProbeError(f"Unknown device '{name}'; use {CHOICES}.") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ProbeError(
                f"Device '{name}' asked for, but torch sees no CUDA GPU; use --device cpu "
                "(or auto)."
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ProbeError(
                f"Device '{name}' asked for, but torch sees {count} CUDA "
                f"GPU{'' if count == 1 else 's'} (cuda:0 to cuda:{count - 1})."
            )
        return device
    if device.type == "mps" and torch.backends.mps.is_available():
        return device
    raise ProbeError(f"Device '{name}' is not one probe runs on here; use {CHOICES}.")


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: the name manifests and config files record."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """A dtype name (float32, bfloat16, float16, or bf16/fp16/fp32) -> torch dtype; None stays
    None (keep the checkpoint's own). Anything else is one line naming the choices."""
    if name is None or isinstance(name, torch.dtype):
        if isinstance(name, torch.dtype) and name not in DTYPES.values():
            raise ProbeError(f"dtype {dtype_name(name)} is not one probe holds weights in; "
                             f"use {DTYPE_CHOICES}.")  # fmt: skip
        return name
    return DTYPES[dtype_named(name)]


@dataclass(frozen=True)
class Runtime:
    """Where a model runs and in what. Resolve it once (`Runtime.resolve`) and pass it down."""

    device: torch.device
    dtype: torch.dtype | None = None  # weights' dtype; None: each checkpoint's own
    threads: int | None = None  # CPU threads torch uses (None: torch's default)
    autocast: bool = False  # training: mixed precision (bf16 autocast) around the forward pass

    @classmethod
    def resolve(cls, device: str | torch.device = "auto", dtype: str | torch.dtype | None = None,
                threads: int | None = None, autocast: bool | None = None) -> Runtime:  # fmt: skip
        """Check and resolve every option now, so a bad name is one line before any work.
        `autocast` None: on for CUDA, off elsewhere (as training has always done)."""
        where = resolve_device(device)
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ProbeError(f"threads must be at least 1, got {threads!r}.")
        if autocast is None:
            autocast = where.type == "cuda"
        return cls(where, resolve_dtype(dtype), threads, bool(autocast))

    @classmethod
    def cpu(cls) -> Runtime:
        return cls(torch.device("cpu"))

    def apply(self) -> None:
        """Set the process's torch thread count (when `threads` was given)."""
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def weights_dtype(self, stored: torch.dtype | str | None) -> torch.dtype:
        """The dtype weights stored as `stored` are held in: the one asked for, else theirs."""
        if self.dtype is not None:
            return self.dtype
        return resolve_dtype(stored) or torch.float32

    @property
    def autocast_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def record(self, model: torch.nn.Module | None = None) -> dict:
        """What a manifest keeps: the device and dtype actually used (a model's own, when
        given), the thread count and whether autocast was on."""
        device, dtype = self.device, self.dtype
        if model is not None:
            first = next(iter(model.parameters()), None)
            if first is not None:
                device, dtype = first.device, first.dtype
        return {
            "device": str(device),
            "dtype": None if dtype is None else dtype_name(dtype),
            "threads": torch.get_num_threads() if device.type == "cpu" else None,
            "autocast": dtype_name(self.autocast_dtype) if self.autocast else None,
        }
