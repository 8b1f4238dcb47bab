"""One GGUF file's metadata as an architecture's config reader sees it (`Meta`): its keys under
the architecture's prefix (`qwen3.embedding_length`), read through `Fields`, and the small
tensors a config is built from (the rotary ones)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from probe.errors import ProbeError
from probe.interop.fields import REQUIRED, Fields


class Meta:
    """The metadata of one file, read under its architecture's prefix; `shapes` are the tensors'
    row-major shapes by GGUF name; `read` reads a small tensor (GGUF name -> (float32 values,
    GGUF type name)), for the rotary tensors a config is built from, which `used` then names."""

    def __init__(self, metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                 arch: str, path: Path,
                 read: Callable[[str], tuple[np.ndarray, str]] | None = None) -> None:  # fmt: skip
        self.label = f"GGUF file '{path}': metadata"
        self.fields = Fields(metadata, self.label)
        self.shapes, self.arch, self.path, self.read = shapes, arch, path, read
        self.used: set[str] = set()  # tensors the config was built from (not weights)

    def tensor(self, name: str) -> tuple[np.ndarray, str]:
        """Tensor `name` as float32 values and its GGUF type, counted as used."""
        if self.read is None:
            raise ProbeError(f"GGUF file '{self.path}': tensor '{name}' cannot be read here")
        self.used.add(name)
        return self.read(name)

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.fields.has(self.key(name))

    def count(self, name: str, default: Any = REQUIRED, lo: int = 1) -> int:
        return self.fields.integer(self.key(name), default, lo=lo)

    def number(self, name: str, default: Any = REQUIRED, positive: bool = True) -> float:
        return self.fields.number(self.key(name), default, positive)

    def flag(self, name: str, default: bool) -> bool:
        return self.fields.flag(self.key(name), default)

    def refuse(self, name: str, why: str) -> None:
        self.fields.refuse(self.key(name), self.fields.raw(self.key(name)), why)
