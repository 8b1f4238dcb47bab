"""The dtypes weights are held in, by the names a user types (no torch: the command line checks a
--dtype before it imports torch; `probe.runtime.DTYPES` maps each name to its torch dtype)."""

from __future__ import annotations

from probe.errors import ProbeError

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the names manifests record
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "f16": "float16", "half": "float16"}  # fmt: skip
DTYPE_CHOICES = "float32, bfloat16 or float16"


def dtype_named(name: str) -> str:
    """The dtype name a user typed (bf16, torch.float16, ...) as one of DTYPE_NAMES; anything
    else is one line naming the choices."""
    text = str(name).strip().lower().removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPE_NAMES:
        raise ProbeError(f"Unknown dtype '{name}'; use {DTYPE_CHOICES}.")
    return text
