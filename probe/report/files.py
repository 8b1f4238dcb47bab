"""Atomic writes of tables, JSON and figures: a reader (or a rerun after kill -9) never sees a
half-written file. Built on the checkpoint module's temporary-file-then-rename writer."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from probe.files import atomic_write_bytes, atomic_write_text

__all__ = ["atomic_save_figure", "atomic_write_csv", "atomic_write_json", "atomic_write_text"]


def atomic_write_json(path: Path | str, obj: Any) -> Path:
    path = Path(path)
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return path


def atomic_write_csv(path: Path | str, df: pd.DataFrame) -> Path:
    path = Path(path)
    atomic_write_text(path, df.to_csv(index=False))
    return path


def atomic_save_figure(path: Path | str, fig: Any, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG through a temporary file and a rename."""
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())
    return path
