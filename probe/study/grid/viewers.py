"""Head viewers for a study's results folder: one `probe view` page per cell whose trained
model is kept (`models/`, git-ignored like the pages), and an index page linking them."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from probe.analysis.view import checkpoint_view
from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.files import atomic_write_text
from probe.report.html.viewer import write_viewer
from probe.study.grid.cells import Cell, expand
from probe.study.grid.plan import model_dir
from probe.study.grid.report import study_from_dir

VIEWERS = "viewers"


def kept_models(out: Path | str) -> list[tuple[Cell, Path]]:
    """(cell, checkpoint folder) for every cell of the results folder whose model is kept."""
    out = Path(out)
    study, _ = study_from_dir(out)
    found = []
    for cell in expand(study):
        model = model_dir(out, cell)
        if (model / "config.json").is_file():
            found.append((cell, model))
    return found


def pick_cell(out: Path | str, which: str | None) -> tuple[Cell, Path]:
    """A kept model by cell index, key prefix or label (the first kept one when None)."""
    kept = kept_models(out)
    if not kept:
        raise ProbeError(
            f"{out} keeps no trained models (results/*/models/ is not committed); run the study "
            "(probe study run) to have them, then view a cell."
        )
    if which is None:
        return kept[0]
    for cell, model in kept:
        if which in (str(cell.index), cell.label) or cell.key.startswith(which):
            return cell, model
    listed = "; ".join(f"{cell.index}: {cell.label}" for cell, _ in kept)
    raise ProbeError(f"no kept model of a cell '{which}' in {out}. Cells with models: {listed}.")


def write_viewers(
    out: Path | str, progress: Callable[[int, int], None] | None = None
) -> list[Path]:
    """viewers/<cell key>.html for each kept model (reused while newer than the model) and
    viewers/index.html; returns the pages written or kept."""
    out = Path(out)
    kept = kept_models(out)
    if not kept:
        return []
    folder = out / VIEWERS
    pages = []
    for i, (cell, model) in enumerate(kept):
        page = folder / f"{cell.key}.html"
        if not page.is_file() or page.stat().st_mtime < (model / "config.json").stat().st_mtime:
            ckpt = load_checkpoint(model, "cpu")
            write_viewer(checkpoint_view(ckpt, title=cell.label), page)
        pages.append((cell, page))
        if progress is not None:
            progress(i + 1, len(kept))
    items = "".join(
        f'<li><a href="{html.escape(p.name)}">{html.escape(c.label)}</a></li>' for c, p in pages
    )
    atomic_write_text(
        folder / "index.html",
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Head viewers</title>'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\"><style>body{font:15px/1.6 system-ui,sans-serif;"
        "max-width:760px;margin:32px auto;padding:0 20px}</style></head><body>"
        f"<h1>Head viewers of {html.escape(out.name)}</h1><p>One page per cell whose trained "
        f'model is kept. Report: <a href="../report.html">report.html</a>.</p><ul>{items}</ul>'
        "</body></html>\n",
    )
    return [p for _, p in pages]
