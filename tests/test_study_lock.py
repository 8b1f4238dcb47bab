"""A run holds its results directory by a lock file that goes when the run ends (normally, on an
error, on Ctrl-C); one left by a killed run blocks nothing; and a head study's rerun removes the
temporary files a killed write left in the folders it owns, never a file of yours."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_head_study_checks import mutated

from probe.errors import ProbeError
from probe.study.runner import LOCK, locked


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("ending", ["normally", "error", "ctrl-c"])
def test_the_lock_file_goes_when_the_run_ends(tmp_path, ending):
    out = tmp_path / "out"
    try:
        with locked(out):
            assert (out / LOCK).read_text().strip() == str(os.getpid())
            if ending == "error":
                raise ProbeError("a step failed")
            if ending == "ctrl-c":
                raise KeyboardInterrupt
    except (ProbeError, KeyboardInterrupt):
        pass
    assert not (out / LOCK).exists()


def test_a_stale_lock_blocks_nothing_and_a_held_one_names_its_holder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(f"{dead_pid()}\n")  # what kill -9 leaves
    with locked(out):
        pass
    assert not (out / LOCK).exists()
    held = rf"process {os.getpid()}\) is writing"
    with locked(out), pytest.raises(ProbeError, match=held), locked(out):
        pass


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from test_cli_imported import hf_dir

    return hf_dir("llama", tmp_path_factory.mktemp("hf"))


def test_a_head_study_rerun_removes_only_its_own_leftovers(llama, tmp_path):
    from probe.study.kinds import load_any
    from probe.study.runner import run_study

    file = tmp_path / "heads.toml"
    off = {"roles": {"enabled": "false", "needles": "0"}, "knockout": {"heads": "[]"},
           "timing": {"fractions": "[]"}, "curves": {"methods": "[]"}}  # fmt: skip
    file.write_text(mutated(llama, off))
    out = tmp_path / "out"
    study = load_any(file)
    run_study(study, out)
    assert not (out / LOCK).exists()
    step = next((out / "steps").iterdir())
    leftovers = [step / ".model.csv.a1b2.probe-tmp", step / ".done.json.x9.probe-tmp"]
    leftovers += [out / ".manifest.json.q.probe-tmp", out / "tables" / ".m.csv.probe-tmp"]
    mine = [out / "notes.probe-tmp", step / "mine.txt", out / "sub" / ".x.probe-tmp"]
    mine[-1].parent.mkdir()
    for path in leftovers + mine:
        path.write_text("torn")
    result = run_study(study, out)
    assert result.n_run == 0  # every step reused
    assert not any(p.exists() for p in leftovers)
    assert all(p.read_text() == "torn" for p in mine)
    assert not (out / LOCK).exists()
