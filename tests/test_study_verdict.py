"""`probe study run` ends with the reproduction verdict the README promises as its last line:
whether the run reproduced the committed reference results/NAME, for both kinds of study."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from probe_cli.main import app
from test_head_study_checks import mutated
from tiny_study import tiny_study
from typer.testing import CliRunner

from probe.study.verdicts import reproduce


def run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["study", "run", *args], catch_exceptions=False)
    return result.exit_code, result.output


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def test_a_grid_study_run_ends_with_its_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "REFERENCE_ROOT", tmp_path / "results")
    file = tmp_path / "tiny.toml"
    file.write_text(tiny_study(steps=2, pes=("learned",)))
    ref = tmp_path / "results" / "tiny"
    code, output = run([str(file), "--out", str(ref), "--device", "cpu"])
    assert code == 0, output
    assert "wrote the committed reference" in last_line(output)
    code, output = run([str(file), "--out", str(tmp_path / "runs" / "tiny"), "--device", "cpu"])
    assert code == 0, output
    line = last_line(output)
    assert line.startswith("Reproduction.") and "reproduced the committed reference" in line
    assert "exactly" in line
    shutil.rmtree(ref)
    code, output = run([str(file), "--out", str(tmp_path / "runs" / "tiny"), "--device", "cpu"])
    assert "No finished run of this study" in last_line(output)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from test_cli_imported import hf_dir

    return hf_dir("llama", tmp_path_factory.mktemp("hf"))


def test_a_head_study_run_ends_with_its_verdict(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "REFERENCE_ROOT", tmp_path / "results")
    file = tmp_path / "heads.toml"
    off = {"roles": {"enabled": "false", "needles": "0"}, "knockout": {"heads": "[]"},
           "timing": {"fractions": "[]"}}  # fmt: skip
    file.write_text(mutated(llama, off))
    ref = tmp_path / "results" / "tiny-checks"
    code, output = run([str(file), "--out", str(ref)])
    assert code == 0, output
    assert "wrote the committed reference" in last_line(output)
    out = tmp_path / "runs" / "tiny-checks"
    code, output = run([str(file), "--out", str(out)])
    assert code == 0, output
    line = last_line(output)
    assert "reproduced the committed reference" in line and "exactly" in line, line
    assert "**Reproduction.** This run reproduced" in (out / "report.md").read_text()
    # a reference whose curve values differ is not reproduced
    curves = pd.read_csv(ref / "tables" / "curves.csv")
    curves["value"] = curves["value"] + 0.5
    curves.to_csv(ref / "tables" / "curves.csv", index=False)
    code, output = run([str(file), "--out", str(out)])
    line = last_line(output)
    assert "did not reproduce" in line and "curves" in line and "0.5" in line, line
    assert json.loads((out / "manifest.json").read_text())["kind"] == "heads"
