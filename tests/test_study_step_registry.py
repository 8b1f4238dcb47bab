"""The registry of grid-study steps: a module that declares `STEP` in the package is found, its
sections are written in their place when the study has their tables, and clashes are refused."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from probe.errors import ProbeError
from probe.study.grid import report as report_module
from probe.study.grid.report import write_report
from probe.study.grid.spec import parse_study
from probe.study.grid.steps import SECTIONS, STEPS, Section, Step, discover, get_step, ordered

STEP_MODULE = """
from probe.study.grid.steps.base import Section, Step

def _write(rep, given):
    rep.heading("{title}")
    return ["{title} said so"]

STEP = Step("{name}", dict, lambda ctx, options: {{}}, ("{name}",), "a test step",
            sections=(Section("{name}", {place}, ("{name}",), _write),))
"""


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package on sys.path holding two step modules and a helper module without a STEP."""
    root = tmp_path / "fake_steps_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "helpers.py").write_text("VALUE = 1\n")
    (root / "later.py").write_text(STEP_MODULE.format(name="later", title="Later", place=20))
    (root / "sooner.py").write_text(STEP_MODULE.format(name="sooner", title="Sooner", place=10))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m.startswith("fake_steps_pkg")]:
        del sys.modules[name]


def test_a_module_that_declares_a_step_is_registered_and_a_helper_is_not(package):
    steps = discover("fake_steps_pkg", [str(package)])
    assert list(steps) == ["later", "sooner"]
    assert [s.name for s in ordered(steps)] == ["sooner", "later"]  # by place, not by file name


def test_two_sections_at_one_place_or_two_steps_of_one_name_are_refused(package):
    steps = discover("fake_steps_pkg", [str(package)])
    clash = Step("other", dict, steps["later"].run, (), "", sections=(
        Section("other", 20, (), steps["later"].sections[0].write),))  # fmt: skip
    with pytest.raises(ProbeError, match="'later' and 'other' share place 20"):
        ordered({**steps, "other": clash})
    (package / "again.py").write_text(STEP_MODULE.format(name="later", title="x", place=30))
    with pytest.raises(ProbeError, match="two analysis steps are named 'later'"):
        discover("fake_steps_pkg", [str(package)])


def test_the_shipped_sections_need_only_tables_that_steps_return():
    returned = {t for step in STEPS.values() for t in step.tables}
    for section in SECTIONS:
        assert set(section.needs) <= returned, section.name
    for step in STEPS.values():  # every table a step returns is presented by a section
        assert set(step.tables) <= {t for s in step.sections for t in s.needs}, step.name
    assert [s.place for s in SECTIONS] == sorted({s.place for s in SECTIONS})


def test_an_unknown_step_names_the_nearest():
    with pytest.raises(ProbeError, match=r"Unknown analysis 'prun'\. Did you mean 'prune'"):
        get_step("prun")


STUDY = """
[study]
name = "order"
question = "Which comes first?"
[base.model]
n_layer = 1
d_model = 16
n_head = 2
[base.train]
train_len = [2, 4]
"""


def test_the_report_writes_registered_sections_by_place_when_their_tables_are_there(
    tmp_path, monkeypatch
):
    def writer(title: str, lines: list[str]):
        def write(rep, given):
            assert given.order == ["learned"] and given.study.name == "order"
            rep.heading(title)
            return lines

        return write

    sections = (
        Section("first", 10, ("a",), writer("First", ["the answer", "first finding"]),
                answers=True),
        Section("missing", 15, ("a", "absent"), writer("Never", ["never"])),
        Section("unwanted", 18, ("a",), writer("Never", ["never"]), applies=lambda s: False),
        Section("second", 20, ("b",), writer("Second", ["second finding"])),
    )  # fmt: skip
    step = Step("x", dict, lambda c, o: {}, ("a", "b"), "", sections=sections[::-1])
    monkeypatch.setattr(report_module, "SECTIONS", ordered({"x": step}))
    study = parse_study(tomllib.loads(STUDY), Path("order.toml"))
    tables = {"a": pd.DataFrame({"x": [1]}), "b": pd.DataFrame({"x": [1]})}
    manifest = {"seeds": [0], "device": "cpu", "created": "now", "cells": []}
    text = write_report(tmp_path, study, tables, manifest)[0].read_text()
    assert "**Answer.** the answer." in text
    assert "- first finding\n- second finding" in text
    assert "Never" not in text
    assert text.index("## First") < text.index("## Second")
