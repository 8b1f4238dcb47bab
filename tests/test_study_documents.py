"""Study files and the JSON a run leaves behind, read back: nested too deeply to parse (Python's
recursion limit), they are one line naming the file, exit code 2."""

from __future__ import annotations

import json

import pytest
from cli_run import exit_code

DEEP = 100_000


def one_line(args: list[str], capsys) -> str:
    code = exit_code(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and "RecursionError" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "text", ["a = " + "[" * DEEP + "]" * DEEP, "a = " + "{b = " * DEEP + "}" * DEEP]
)
def test_a_deeply_nested_study_file_is_one_line(tmp_path, capsys, text):
    file = tmp_path / "deep.toml"
    file.write_text('[study]\nquestion = "q?"\n[base.model]\n' + text + "\n")
    for command in ("validate", "run"):
        err = one_line(["study", command, str(file)], capsys)
        assert str(file) in err and "too deeply" in err


def test_deeply_nested_json_read_back_is_one_line(tmp_path, capsys):
    deep = "[" * DEEP + "]" * DEEP
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(deep)
    err = one_line(["study", "report", str(out)], capsys)
    assert str(out / "manifest.json") in err and "too deeply" in err
    # a head study's results: the manifest is fine, study.json is not
    (out / "manifest.json").write_text(json.dumps({"study": "x", "kind": "heads"}))
    (out / "study.json").write_text(deep)
    err = one_line(["study", "report", str(out)], capsys)
    assert str(out / "study.json") in err and "too deeply" in err


def test_a_results_folder_whose_json_cannot_be_read_is_not_taken_for_one(tmp_path, capsys):
    from tiny_study import tiny_study

    file = tmp_path / "tiny.toml"
    file.write_text(tiny_study(steps=2))
    out = tmp_path / "out"
    out.mkdir()
    for name in ("study.json", "manifest.json"):
        (out / name).write_text("[" * DEEP + "]" * DEEP)
    err = one_line(["study", "run", str(file), "--out", str(out), "--device", "cpu"], capsys)
    assert str(out) in err and "--overwrite" in err
