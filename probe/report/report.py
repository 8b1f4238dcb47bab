"""A Markdown report with its tables (CSV) and figures (PNG) written beside it.

Knows nothing about studies or models: it takes DataFrames and matplotlib figures. Every file goes
through an atomic write, so a report folder never holds a half-written file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probe.report.files import atomic_save_figure, atomic_write_csv, atomic_write_text
from probe.report.html.report_page import report_html


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, float | np.floating):
        if np.isnan(value):
            return "–"
        return f"{value:.{digits}f}"
    text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, digits: int = 2) -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned)."""
    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    align = ["---:" if pd.api.types.is_numeric_dtype(df[c]) else ":---" for c in df.columns]
    lines = [header, "| " + " | ".join(align) + " |"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v, digits) for v in row) + " |")
    return "\n".join(lines)


class MarkdownReport:
    """Collects Markdown blocks; `table` and `figure` write their files into `folder`."""

    def __init__(self, folder: Path | str, title: str) -> None:
        self.folder = Path(folder)
        self.blocks: list[str] = [f"# {title}"]
        self.files: list[str] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(f"{'#' * level} {text}")

    def paragraph(self, text: str) -> None:
        self.blocks.append(text.strip())

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append("\n".join(f"- {item}" for item in items))

    def table(
        self,
        display: pd.DataFrame,
        csv: str | None = None,
        data: pd.DataFrame | None = None,
        caption: str = "",
        digits: int = 2,
    ) -> None:
        """Show `display` as Markdown; write `data` (default: `display`) to `csv` beside it."""
        block = markdown_table(display, digits)
        if csv is not None:
            atomic_write_csv(self.folder / csv, display if data is None else data)
            self.files.append(csv)
            caption = f"{caption} " if caption else ""
            block += f"\n\n{caption}Data: [{csv}]({csv})"
        elif caption:
            block += f"\n\n{caption}"
        self.blocks.append(block)

    def data(self, df: pd.DataFrame, csv: str, caption: str) -> None:
        """Write `df` to `csv` beside the report and link it (no table shown)."""
        atomic_write_csv(self.folder / csv, df)
        self.files.append(csv)
        self.blocks.append(f"{caption} Data: [{csv}]({csv})")

    def figure(self, fig: Any, png: str, caption: str) -> None:
        """Save `fig` as `png` beside the report, close it and reference it."""
        atomic_save_figure(self.folder / png, fig)
        plt.close(fig)
        self.files.append(png)
        self.blocks.append(f"![{caption}]({png})\n\n*{caption}*")

    def text(self) -> str:
        return "\n\n".join(self.blocks) + "\n"

    def write(self, name: str = "report.md") -> Path:
        """Write the Markdown report, and beside it the same as one self-contained HTML page
        (figures embedded)."""
        path = self.folder / name
        text = self.text()
        atomic_write_text(path, text)
        atomic_write_text(path.with_suffix(".html"), report_html(text, self.folder))
        return path
