"""Where a computation runs: a `--device` name resolved once to a `torch.device`, with one clear
line for a name torch does not know or a device this machine does not have."""

from __future__ import annotations

import torch

from probe.errors import ProbeError

CHOICES = "auto, cpu, cuda or cuda:N"


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
