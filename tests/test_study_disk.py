"""A study run changes nothing it did not create: clean-up touches only probe's own temporary
files, a results directory belongs to one study, and a damaged cell is computed again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from tiny_study import tiny_study

from probe.errors import ProbeError
from probe.study.grid.spec import load_study
from probe.study.runner import load_tables, run_study


def study_file(tmp_path: Path, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(tiny_study(steps=2).replace('name = "tiny"', f'name = "{name}"'))
    return path


def test_clean_up_removes_only_probes_own_temporary_files(tmp_path):
    out = tmp_path / "out"
    study = load_study(study_file(tmp_path))
    run_study(study, out, device="cpu")
    # what a killed run leaves: a half-written table and a half-trained model ...
    cell = next((out / "cells").iterdir())
    leftovers = [cell / ".eval.csv.k2j4.probe-tmp", out / "tables" / ".eval.csv.x1.probe-tmp"]
    for path in leftovers:
        path.write_text("torn")
    (out / "models" / ".abc.probe-tmp-123").mkdir()
    # ... and the user's own files, which merely look temporary
    mine = [out / "notes.tmp", out / ".draft.tmp", cell / ".mine.tmp", out / "sub" / ".x.probe-tmp"]
    mine[-1].parent.mkdir()
    for path in mine:
        path.write_text("keep me")
    run_study(study, out, device="cpu")
    assert not any(p.exists() for p in leftovers)
    assert not (out / "models" / ".abc.probe-tmp-123").exists()
    assert all(p.read_text() == "keep me" for p in mine)


def test_a_results_directory_belongs_to_one_study(tmp_path):
    out = tmp_path / "out"
    run_study(load_study(study_file(tmp_path, "first")), out, device="cpu")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = load_study(study_file(tmp_path, "second"))
    with pytest.raises(ProbeError, match="holds the results of study 'first'"):
        run_study(other, out, device="cpu")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    user = tmp_path / "mine"
    user.mkdir()
    (user / "report.md").write_text("my notes")
    with pytest.raises(ProbeError, match="not a results directory"):
        run_study(other, user, device="cpu")
    assert (user / "report.md").read_text() == "my notes"
    run_study(other, out, device="cpu", overwrite=True)  # told to: it writes there
    assert json.loads((out / "study.json").read_text())["name"] == "second"


def test_a_damaged_cell_is_computed_again_and_the_run_says_so(tmp_path):
    out = tmp_path / "out"
    study = load_study(study_file(tmp_path))
    run_study(study, out, device="cpu")
    good = load_tables(out)["eval"]
    cell = sorted((out / "cells").iterdir())[0]
    text = (cell / "eval.csv").read_text()
    (cell / "eval.csv").write_text(text[: len(text) // 2])  # truncated mid-row
    events = []
    result = run_study(study, out, device="cpu", progress=events.append)
    stale = [e for e in events if e.kind == "unit-stale"]
    assert len(stale) == 1 and "eval.csv" in stale[0].note
    assert sum(not r.cached for r in result.records) == 1
    pd.testing.assert_frame_equal(load_tables(out)["eval"], good, check_exact=True)
    done = json.loads((cell / "done.json").read_text())
    assert set(done["sha256"]) == {"eval.csv", "train.csv"}


def test_every_kind_of_damage_to_a_cell_is_named_and_the_cell_computed_again(tmp_path):
    out = tmp_path / "out"
    study = load_study(study_file(tmp_path))
    run_study(study, out, device="cpu")
    good = load_tables(out)
    cells = sorted((out / "cells").iterdir())
    (cells[0] / "eval.csv").unlink()  # a table deleted
    done = json.loads((cells[1] / "done.json").read_text())
    (cells[1] / "done.json").write_text(json.dumps({**done, "hash": "0" * 16}))  # edited
    (cells[2] / "done.json").write_text((cells[2] / "done.json").read_text()[:30])  # torn
    events = []
    result = run_study(study, out, device="cpu", progress=events.append)
    notes = {e.label: e.note for e in events if e.kind == "unit-stale"}
    labels = {json.loads((c / "done.json").read_text())["label"]: c for c in cells}  # rewritten
    by_cell = {labels[label]: note for label, note in notes.items()}
    assert sorted(by_cell) == cells[:3]
    assert by_cell[cells[0]] == "eval.csv is missing; computing it again"
    assert by_cell[cells[1]].startswith("done.json records another hash")
    assert by_cell[cells[2]].startswith("done.json cannot be read")
    assert sum(not r.cached for r in result.records) == 3
    for name, table in load_tables(out).items():
        pd.testing.assert_frame_equal(table, good[name], check_exact=True)


def test_a_partial_report_covers_the_finished_cells_and_says_what_is_missing(tmp_path):
    from probe.study.grid.cells import expand
    from probe.study.grid.report import report_from_dir
    from probe.study.runner import finished_tables, plan_for

    out = tmp_path / "out"
    study = load_study(study_file(tmp_path))
    run_study(study, out, device="cpu")
    full, missing = finished_tables(plan_for(study, out))
    assert missing == []
    for name, table in load_tables(out).items():  # read exactly as the gathered tables are
        pd.testing.assert_frame_equal(full[name], table, check_exact=True)
    gone = expand(study)[1]
    for path in (out / "cells" / gone.key).iterdir():
        path.unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["n_done"] -= 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ProbeError, match="--partial"):
        report_from_dir(out)
    path, _ = report_from_dir(out, partial=True)
    text = path.read_text()
    assert f"**Partial report**: 3 of 4 cells are finished; not yet: {gone.label}." in text
    assert f"`probe study run {study.where} --out {out}` finishes the run" in text  # that folder
    partial = pd.read_csv(out / "accuracy_by_length.csv")
    assert set(partial["seed"][partial["arm"] == gone.arm]) == {1 - gone.seed}


def test_a_study_of_the_other_kind_with_the_same_name_is_refused(tmp_path):
    """A grid study and a head study may share a name (and so a default --out): neither writes
    into the other's results, whose tables and report files would be mixed with its own."""
    from probe.study.engine.workdir import check_results_dir

    out = tmp_path / "out"
    study = load_study(study_file(tmp_path))
    run_study(study, out, device="cpu")
    heads = type("HeadStudy", (), {"name": study.name, "is_smoke": False})()
    with pytest.raises(
        ProbeError,
        match=r"holds the results of study 'tiny' \(a grid study\), not of this heads study",
    ):
        check_results_dir(out, heads, kind="heads")
    check_results_dir(out, heads, overwrite=True, kind="heads")
    check_results_dir(out, study)  # its own
    (out / "study.json").write_text(json.dumps({"name": "tiny", "kind": "heads"}))
    with pytest.raises(
        ProbeError,
        match=r"holds the results of study 'tiny' \(a heads study\), not of this grid study",
    ):
        check_results_dir(out, study)


def test_a_table_the_study_no_longer_makes_leaves_the_gathered_tables(tmp_path):
    """Dropping an analysis from the study file: its old table goes from tables/, so the report
    rebuilt from the folder presents what the run made, not what an earlier run did."""
    out = tmp_path / "out"
    attention = '\n[analysis.attention]\nlengths = "L"\nstatistics = ["normalized_entropy"]\n'
    path = study_file(tmp_path)
    path.write_text(path.read_text() + attention)
    run_study(load_study(path), out, device="cpu")
    assert "attention" in load_tables(out)
    result = run_study(load_study(study_file(tmp_path)), out, device="cpu")
    assert sorted(load_tables(out)) == sorted(result.tables) == ["eval", "train"]
