"""Report captions say what is drawn for the data at hand: bands and intervals over seeds where
there are two or more seeds, "one seed: no band" where there is one; and a band drawn over seeds
stays within the range of the values it summarises (seaborn's bootstrap, not a t-interval)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_study_report import MANIFEST, STUDY, fake_tables

from probe.study.grid.report import write_report
from probe.study.grid.spec import parse_study
from probe.study.verdicts.stats import band_words, interval_words

TWO_OR_MORE = "Lines are means over seeds, bands 95% bootstrap intervals; the grey band"


def report_text(tmp_path: Path, seeds: tuple[int, ...]) -> str:
    tables = {k: t[t["seed"].isin(seeds)] for k, t in fake_tables().items()}
    study = parse_study(tomllib.loads(STUDY), Path("fake.toml"))
    path, _ = write_report(tmp_path, study, tables, MANIFEST)
    return path.read_text()


def test_a_report_of_one_seed_promises_no_band(tmp_path):
    one = report_text(tmp_path / "one", (0,))
    assert "Lines are single runs (one seed: no band); the grey band" in one
    assert "bootstrap" not in one.replace("bootstrap resamples", "")  # no interval promised
    assert "Mean over seeds [95%" not in one and "One seed per cell" in one


def test_captions_follow_the_seeds_behind_each_point():
    assert band_words([3, 3, 2]) == TWO_OR_MORE.split(";")[0]  # the committed reports' text
    assert band_words([1, 1]) == "Lines are single runs (one seed: no band)"
    assert "no band where a point has one seed" in band_words([1, 3])
    assert band_words([1], short=True) == "one seed: no band"
    assert interval_words([2, 3]) == "mean over seeds [95% bootstrap interval]"
    assert interval_words([1]) == "one seed, so no interval"
    assert "where there are two or more seeds" in interval_words([1, 2])


def test_sections_with_one_seed_say_so(tmp_path):
    """Roles, the spread of heads and the position probe: one seed, no interval promised."""
    from probe.report.report import MarkdownReport
    from probe.study.grid.steps import attention, position_probe, roles

    rows = [{"cell": f"c{arm}", "arm": arm, "seed": 0, "layer": 0, "head": h, "length": 8,
             "statistic": s, "value": 0.1 * h, "depth": 1}
            for arm in ("a", "b") for h in range(4)
            for s in ("previous_token", "normalized_entropy", "r2")]  # fmt: skip
    table = pd.DataFrame(rows)
    rep = MarkdownReport(tmp_path / "report.md", "t")
    roles.section(rep, table[table["statistic"] == "previous_token"], ["a", "b"])
    attention.head_spread(rep, table, ["a", "b"])
    position_probe.section(rep, table[table["statistic"] == "r2"], ["a", "b"])
    text = "\n".join(str(b) for b in rep.blocks)
    assert "95%" not in text
    assert "the model, one seed, so no interval." in text
    assert (
        "One seed, so no interval." in text and "R^2 per depth: one seed, so no interval." in text
    )


def test_contrast_note_with_one_seed():
    from probe.study.verdicts.contrast_text import _interval_note

    assert _interval_note([3, 3]) == "Means are over seeds with 95% bootstrap intervals."
    assert "no interval" in _interval_note([1, 1])
    assert "none for an arm with one seed" in _interval_note([1, 3])


@pytest.mark.parametrize("plot", ["length", "pruning", "training", "depth"])
def test_a_band_over_seeds_stays_within_the_values(plot):
    """Two seeds at 0 and 1 at every point: a t-interval would reach far past both; seaborn's
    bootstrap band stays in [0, 1] (a metric's range is never left)."""
    from probe.report import study_plots as plots

    rows = [{"arm": "a", "task": "copy", "method": "random", "metric": "p_max", "seed": seed,
             "length": n, "fraction": n / 10, "step": n, "depth": n, "L": 4, "value": float(seed)}
            for seed in (0, 1) for n in (2, 4, 6)]  # fmt: skip
    df = pd.DataFrame(rows)
    fig = {
        "length": lambda: plots.length_curves(df, "exact match"),
        "pruning": lambda: plots.pruning_curves(df, "exact match"),
        "training": lambda: plots.attention_training_curves(df, ["p_max"]),
        "depth": lambda: plots.depth_curves(df, "R^2"),
    }[plot]()
    bands = [p for ax in fig.axes for c in ax.collections for p in c.get_paths()
             if len(p.vertices) > 2]  # fmt: skip
    assert bands, "no band drawn"
    y = np.concatenate([p.vertices[:, 1] for p in bands])
    assert y.min() >= 0.0 and y.max() <= 1.0
    assert y.max() - y.min() > 0.5  # a band, not a line
