"""The runner: cache hits skip work, kill -9 and resume, same seed same tables, --jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from processes import alive, children, snapshot, wait_until
from tiny_study import tiny_study

from probe.errors import ProbeError
from probe.study.grid import plan as cells_module
from probe.study.grid.cells import expand
from probe.study.grid.spec import load_study
from probe.study.runner import load_tables, run_study


def write_study(tmp_path: Path, steps: int = 4) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_study(steps=steps))
    return path


def assert_same_tables(a: Path, b: Path) -> None:
    ta, tb = load_tables(a), load_tables(b)
    assert sorted(ta) == sorted(tb) == ["eval", "train"]
    for name in ta:
        pd.testing.assert_frame_equal(ta[name], tb[name], check_exact=True)


def test_run_writes_tables_manifest_and_cell_files(tmp_path):
    study = load_study(write_study(tmp_path))
    result = run_study(study, tmp_path / "out", device="cpu")
    out = tmp_path / "out"
    assert [r.cached for r in result.records] == [False] * 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_cells"] == manifest["n_done"] == 4
    assert manifest["seeds"] == [0, 1]
    assert {"versions", "git_commit", "device", "created"} <= set(manifest)
    assert all(c["status"] == "done" and c["wall_s"] >= 0 for c in manifest["cells"])
    eval_table = result.tables["eval"]
    assert set(eval_table["arm"]) == {"learned", "rope"}
    assert sorted(eval_table["length"].unique()) == list(range(1, 7))  # 1:2L with L = 3
    assert len(eval_table) == 4 * 6 * 3  # cells x lengths x metrics
    for cell in expand(study):
        assert (out / "cells" / cell.key / "done.json").exists()
    assert (out / "study.toml").read_text() == study.path.read_text()
    assert not list(out.rglob("*.tmp*"))


def test_a_rerun_skips_finished_cells_and_trains_nothing(tmp_path, monkeypatch):
    study = load_study(write_study(tmp_path))
    first = run_study(study, tmp_path / "out", device="cpu")

    def no_training(*args, **kwargs):
        raise AssertionError("a cached cell was trained again")

    monkeypatch.setattr("probe.training.train.train", no_training)
    monkeypatch.setattr(cells_module, "get_step", lambda name: pytest.fail("analysis rerun"))
    again = run_study(study, tmp_path / "out", device="cpu")
    assert [r.cached for r in again.records] == [True] * 4
    for name in first.tables:
        pd.testing.assert_frame_equal(first.tables[name], again.tables[name], check_exact=True)


def test_finished_models_are_reused_when_only_the_analyses_change(tmp_path, monkeypatch):
    path = write_study(tmp_path)
    run_study(load_study(path), tmp_path / "out", device="cpu")
    path.write_text(path.read_text().replace('lengths = "1:2L"', 'lengths = "1:3L"'))
    monkeypatch.setattr(
        "probe.training.train.train", lambda *a, **k: pytest.fail("model retrained")
    )
    result = run_study(load_study(path), tmp_path / "out", device="cpu")
    assert [r.cached for r in result.records] == [False] * 4
    assert all(r.facts["train_s"] == 0 for r in result.records)
    assert result.tables["eval"]["length"].max() == 9


def test_the_same_seeds_give_identical_tables(tmp_path):
    study = load_study(write_study(tmp_path))
    run_study(study, tmp_path / "a", device="cpu")
    run_study(study, tmp_path / "b", device="cpu")
    assert_same_tables(tmp_path / "a", tmp_path / "b")


def test_a_second_run_on_the_same_directory_is_refused_while_one_holds_it(tmp_path):
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    with (out / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(ProbeError, match="another `probe study run`"):
            run_study(load_study(write_study(tmp_path)), out, device="cpu")


def test_killed_run_resumes_to_the_same_tables(tmp_path):
    """kill -9 a run in a subprocess once a cell has finished, rerun it, compare with an
    uninterrupted run."""
    path = write_study(tmp_path, steps=40)
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "probe_cli.main", "study", "run", str(path), "--out",
               str(killed), "--device", "cpu"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(killed.glob("cells/*/done.json")):
        assert process.poll() is None, process.stderr.read().decode()
        assert time.time() < deadline, "no cell finished in time"
        time.sleep(0.02)
    time.sleep(0.1)  # now inside a later cell: training, evaluating or writing
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished = {p.parent.name: p.stat().st_mtime_ns for p in killed.glob("cells/*/done.json")}
    assert 1 <= len(finished) < 4, "the run was not interrupted mid-way"

    resumed = run_study(load_study(path), killed, device="cpu")
    for record in resumed.records:
        assert record.cached == (record.key in finished)
    for key, mtime in finished.items():
        assert (killed / "cells" / key / "done.json").stat().st_mtime_ns == mtime
    assert not list(killed.rglob("*.tmp*"))

    run_study(load_study(path), tmp_path / "whole", device="cpu")
    assert_same_tables(killed, tmp_path / "whole")


@pytest.mark.slow
def test_parallel_jobs_give_the_same_tables(tmp_path):
    study = load_study(write_study(tmp_path))
    events = []
    run_study(study, tmp_path / "serial", device="cpu")
    result = run_study(study, tmp_path / "parallel", device="cpu", jobs=2, progress=events.append)
    assert [r.cached for r in result.records] == [False] * 4
    assert sum(e.kind == "unit-done" for e in events) == 4
    assert any(e.kind == "unit" and e.phase == "train" for e in events)
    assert_same_tables(tmp_path / "serial", tmp_path / "parallel")
    # the workers record the commit the run started from (passed on to them pinned)
    assert {r.git_commit for r in result.records} == {result.manifest["git_commit"]}


def test_every_cell_records_the_commit_the_run_started_from(tmp_path, monkeypatch):
    from probe import provenance

    commits = iter(f"commit-{i}" for i in range(1, 100))  # HEAD moves at every look
    monkeypatch.setattr(provenance, "_read_git", lambda where: next(commits))
    monkeypatch.delenv(provenance.PIN, raising=False)
    study = load_study(write_study(tmp_path))
    run_study(study, tmp_path / "out", device="cpu")
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["git_commit"] == "commit-1"
    assert [c["git_commit"] for c in manifest["cells"]] == ["commit-1"] * 4
    for cell in expand(study):
        done = json.loads((out / "cells" / cell.key / "done.json").read_text())
        model = json.loads((out / "models" / cell.train_key / "config.json").read_text())
        assert done["git_commit"] == model["meta"]["git_commit"] == "commit-1"
    assert provenance.PIN not in os.environ
    assert provenance.git_commit() == "commit-2"  # unpinned after the run


def _parallel_run(tmp_path, helpers: int) -> tuple[subprocess.Popen, set[int]]:
    """A `--jobs 2` study run of long cells, once it has `helpers` child processes and 2 s more
    (its workers are training, or on a loaded machine still importing torch); its children."""
    path = write_study(tmp_path, steps=5000)
    command = [sys.executable, "-m", "probe_cli.main", "study", "run", str(path), "--out",
               str(tmp_path / "out"), "--device", "cpu", "--jobs", "2"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = wait_until(
        lambda: len(children(process.pid)) >= helpers or process.poll() is not None, 60
    )
    assert process.poll() is None, process.stderr.read().decode()
    assert started, "the workers did not start"
    time.sleep(2.0)
    return process, set(children(process.pid))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_sigterm_stops_the_parallel_workers_too(tmp_path):
    """kill PID (SIGTERM) on a `--jobs 2` run: the parent exits 130 with one line and its
    worker processes do not go on training and writing into the results folder."""
    process, workers = _parallel_run(tmp_path, 3)  # resource tracker or manager, two workers
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == 130
    assert "interrupted:" in process.stderr.read().decode()
    time.sleep(0.5)
    left = {pid for pid in workers if alive(pid)}
    assert not left, f"worker processes left running: {left}"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_kill_9_of_a_parallel_run_leaves_no_worker_writing(tmp_path):
    """kill -9 of a `--jobs 2` run: its worker processes (and the manager relaying their
    progress) die with it, rather than going on writing cells into a folder nobody holds. A
    worker still importing torch when the run dies (a loaded machine) has not tied itself to
    the run yet: it exits at the tie, before taking a unit, so the test allows for that."""
    process, helpers = _parallel_run(tmp_path, 4)  # resource tracker, manager, two workers
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    written = snapshot(tmp_path / "out")
    gone = wait_until(lambda: not any(alive(pid) for pid in helpers), 60)
    left = sorted(pid for pid in helpers if alive(pid))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert gone, f"processes outlived the killed run: {left}"
    assert snapshot(tmp_path / "out") == written, (
        "a worker wrote into the results folder after the run died"
    )


def test_a_python_caller_runs_reports_and_judges_a_study_in_one_call(tmp_path):
    """`probe.study.runner.run` does what `probe study run` does: the report written, the
    expectations judged (as the CLI's exit code reads them), the reproduction verdict given;
    a second call reuses every unit."""
    from tiny_study import tiny_study

    from probe.study.runner import run

    path = tmp_path / "tiny.toml"
    expect = '\n[[expect]]\ntable = "eval"\nmetric = "loss"\nbound = ">= 0"\n'
    path.write_text(tiny_study(steps=2, pes=("rope",), extra=expect))
    done = run(path, tmp_path / "out")
    assert done.report == tmp_path / "out" / "report.md" and done.report.exists()
    assert [o.passed for o in done.outcomes] == [True] and done.passed
    assert done.verdict and done.result.n_run == 2
    again = run(path, tmp_path / "out")
    assert again.result.n_run == 0 and again.result.n_cached == 2
