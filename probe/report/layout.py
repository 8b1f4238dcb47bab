"""Figure layout shared by the report's plots: a figure title that never sits on its panels.

`fig.suptitle` alone is placed at a fixed share of the figure's height (98%), so on a tall figure
(SmolLM2's 30 layers of heatmaps) it lands on the first row's panel titles, and a plain
`tight_layout` does not move the panels out of its way. `title_above` puts the title at the top
edge and lowers the panels until their titles and labels clear it."""

from __future__ import annotations

from typing import Any

PAD_POINTS = 6.0  # space between the figure title and the panels below it


def _panels_top(fig, renderer) -> float:
    """The highest pixel any visible panel (its title, labels and colour bar too) reaches."""
    return max(ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible())


def title_above(fig, title: str, **text: Any):
    """Title `fig` at its top edge; call it after the figure's own layout (tight_layout, or a
    seaborn grid's), which it keeps except for lowering the top of the panels. Returns the
    title's Text."""
    label = fig.suptitle(title, y=1.0, va="top", **text)
    pad = PAD_POINTS * fig.dpi / 72.0
    for _ in range(3):  # the panels' titles move with them: one step clears, the rest check
        renderer = fig.canvas.get_renderer()
        gap = label.get_window_extent(renderer).y0 - pad - _panels_top(fig, renderer)
        if gap >= 0:
            break
        top = fig.subplotpars.top + gap / fig.bbox.height
        fig.subplots_adjust(top=max(top, fig.subplotpars.bottom + 0.05))
    return label
