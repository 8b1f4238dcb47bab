"""`probe study run | ls | validate | report` through the real entry point."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_run import exit_code
from tiny_study import SMOKE, tiny_study

TINY = tiny_study(
    steps=3,
    pes=("rope",),
    question="Does the command line work?",
    extra="""
[[expect]]
table = "eval"
metric = "loss"
bound = ">= 0"

[[expect]]
name = "impossible in smoke"
table = "eval"
metric = "exact_match"
bound = "> 1"
when = "smoke"
"""
    + SMOKE,
)


@pytest.fixture
def study_file(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_validate_ok_and_invalid(study_file, tmp_path, capsys):
    assert exit_code(["study", "validate", str(study_file)]) == 0
    assert "2 cells, smoke 1" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("n_head = 2", "n_heads = 2"))
    assert exit_code(["study", "validate", str(study_file), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "n_heads" in err and "Did you mean 'n_head'?" in err and "1 of 2" in err


def test_validate_takes_a_folder_and_run_refuses_one(study_file, tmp_path, capsys):
    assert exit_code(["study", "validate", str(study_file.parent)]) == 0
    assert f"ok {study_file}" in capsys.readouterr().out
    assert exit_code(["study", "validate", str(tmp_path / "empty")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert exit_code(["study", "validate", str(empty)]) == 2
    assert "No study files" in capsys.readouterr().err
    assert exit_code(["study", "run", str(study_file.parent)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_ls_lists_the_folder(study_file, capsys):
    assert exit_code(["study", "ls", str(study_file.parent)]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "Does the command line" in out


def test_run_report_and_junit(study_file, tmp_path, capsys):
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    code = exit_code(["study", "run", str(study_file), "--out", str(out), "--device", "cpu",
                "--junit", str(junit)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert (out / "report.md").exists() and (out / "manifest.json").exists()
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    assert "cells run" in capsys.readouterr().out
    (out / "report.md").unlink()
    assert exit_code(["study", "report", str(out)]) == 0
    assert (out / "report.md").exists()


def test_failed_expectation_exits_1(study_file, tmp_path, capsys):
    junit = tmp_path / "junit.xml"
    code = exit_code(["study", "run", str(study_file), "--smoke", "--out", str(tmp_path / "s"),
                "--device", "cpu", "--junit", str(junit)])  # fmt: skip
    assert code == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "impossible in smoke" in captured.out
    assert "1 of 2 expectations failed" in captured.err
    assert ET.parse(junit).getroot().find("testsuite").get("failures") == "1"


def test_bad_input_exits_2(study_file, tmp_path, capsys):
    assert exit_code(["study", "run", str(tmp_path / "nope.toml")]) == 2
    assert "No study file" in capsys.readouterr().err
    assert (
        exit_code(["study", "run", str(study_file), "--jobs", "0", "--out", str(tmp_path / "o")])
        == 2
    )
    assert exit_code(["study", "report", str(tmp_path)]) == 2
    assert "manifest.json" in capsys.readouterr().err


@pytest.fixture
def wide_console(monkeypatch):
    """Room for a whole error message on one table row (rich folds cells at 80 columns)."""
    from probe_cli.common import console

    monkeypatch.setattr(console, "width", 400)


def test_validate_checks_every_file_and_names_each_problem(study_file, tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_text(TINY.replace("d_model = 16", 'd_model = "big"'))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    evl = tmp_path / "evl.toml"
    evl.write_text(
        TINY.replace('table = "eval"\nmetric = "loss"', 'table = "evl"\nmetric = "loss"')
    )
    files = [big, study_file, binary, evl, tmp_path / "missing.toml"]
    assert exit_code(["study", "validate", *map(str, files)]) == 2
    out, err = capsys.readouterr()
    assert f"ok {study_file}: 2 cells" in out
    lines = [line for line in err.splitlines() if line.startswith("invalid ")]
    assert len(lines) == 4
    assert f"{big} [base.model] model field 'd_model' must be an integer" in lines[0]
    assert f"{binary} is not a text file" in lines[1]
    assert "table 'evl'" in lines[2] and "Did you mean 'eval'?" in lines[2]
    assert "No study file" in lines[3]
    assert "4 of 5 study files are invalid" in err
    assert "Traceback" not in out + err


def test_ls_lists_good_files_and_marks_bad_ones(study_file, tmp_path, capsys, wide_console):
    (tmp_path / "binary.toml").write_bytes(b"\x00\xff\xfe")
    (tmp_path / "steps.toml").write_text(TINY.replace("steps = 3", 'steps = "50"'))
    assert exit_code(["study", "ls", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if ".toml" in line}
    assert "Does the command line work?" in rows[str(study_file)]
    assert "invalid" in rows[str(tmp_path / "binary.toml")]
    assert "is not a text file" in rows[str(tmp_path / "binary.toml")]
    steps = rows[str(tmp_path / "steps.toml")]
    assert "invalid" in steps and "[base.train] train field 'steps' must be an integer" in steps
    assert "Traceback" not in out + err
