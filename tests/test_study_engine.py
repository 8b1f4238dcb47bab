"""The one study engine: a head study runs as the grid studies do, in worker processes
(--jobs) and on Ray, with the same tables as a run in this process, the same cache and the same
manifest; a unit's cache is checksummed whichever kind wrote it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_run import exit_code
from test_head_study_checks import mutated

from probe.study.engine.store import Store, read_table
from probe.study.kinds import load_any
from probe.study.runner import load_tables, plan_for, run_study
from probe.study.verdicts.reproduce import TIMED

pytest.importorskip("transformers")

# no timing (wall clock differs run to run) and no needles (a second of work saved)
SMALL = {"roles": {"needles": "0"}, "knockout": {"heads": "[]"}, "timing": {"fractions": "[]"},
         "curves": {"methods": '["random", "gradient"]'},
         "importance": {"methods": '["random", "gradient"]'}}  # fmt: skip


@pytest.fixture(scope="module")
def study_file(tmp_path_factory) -> Path:
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("engine")
    file = root / "heads.toml"
    file.write_text(mutated(hf_dir("llama", root / "models"), SMALL))
    return file


def same_tables(a: Path, b: Path) -> None:
    ta, tb = load_tables(a), load_tables(b)
    assert set(ta) == set(tb) and ta
    for name in ta:  # everything but what is timed (wall clock)
        a, b = (t.drop(columns=[c for c in TIMED if c in t.columns]) for t in (ta[name], tb[name]))
        pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.fixture(scope="module")
def here(study_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("here") / "out"
    run_study(load_any(study_file), out)
    return out


def test_a_head_study_in_two_worker_processes_gives_the_same_tables(study_file, here, tmp_path):
    out = tmp_path / "jobs"
    result = run_study(load_any(study_file), out, jobs=2)
    assert result.n_run == len(result.records) > 2 and result.manifest["jobs"] == 2
    same_tables(here, out)
    again = run_study(load_any(study_file), out, jobs=2)
    assert again.n_run == 0  # every step reused, whichever process wrote it


def test_a_head_step_is_checksummed_and_computed_again_when_damaged(study_file, here, tmp_path):
    out = tmp_path / "copy"
    run_study(load_any(study_file), out)
    plan = plan_for(load_any(study_file), out)
    step = plan.units({})[1]  # an importance step
    done = json.loads((out / "steps" / step.key / "done.json").read_text())
    assert done["hash"] == step.digest and done["kind"] == "importance"
    path = out / "steps" / step.key / "importance.csv"
    assert set(done["sha256"]) == {path.name}
    path.write_text(path.read_text()[:40])  # torn
    events = []
    result = run_study(load_any(study_file), out, progress=events.append)
    assert [e.label for e in events if e.kind == "unit-stale"] == [step.key]
    assert result.n_run == 1
    same_tables(here, out)


def test_a_step_cached_before_the_engine_is_reused(study_file, here, tmp_path):
    """A head study's steps written before the engine (one table.csv, no checksums) stay valid."""
    import shutil

    out = tmp_path / "old"
    shutil.copytree(here, out)
    plan = plan_for(load_any(study_file), out)
    store = Store(out, "steps")
    for unit in plan.units({}):
        folder = store.dir(unit)
        done = json.loads((folder / "done.json").read_text())
        (folder / f"{unit.kind}.csv").rename(folder / "table.csv")
        old = {k: done[k] for k in ("hash", "kind", "options", "seconds", "git_commit")}
        (folder / "done.json").write_text(json.dumps(old))
    result = run_study(load_any(study_file), out)
    assert result.n_run == 0
    same_tables(here, out)
    table = read_table(out / "steps" / "model" / "table.csv")
    assert len(table) == 1


def test_the_cli_runs_a_head_study_with_jobs_and_says_how_many_steps(study_file, tmp_path, capsys):
    out = tmp_path / "cli"
    assert exit_code(["study", "run", str(study_file), "--out", str(out), "--jobs", "2"]) == 0
    said = capsys.readouterr().out
    assert "steps run, 0 reused from the cache" in said
    assert (out / "report.md").is_file()
    assert json.loads((out / "manifest.json").read_text())["kind"] == "heads"


@pytest.mark.slow
def test_a_head_study_on_ray_gives_the_same_tables(study_file, here, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'probe[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = tmp_path / "ray"
        result = run_study(load_any(study_file), out, executor="ray")
        assert result.n_run == len(result.records) and result.manifest["executor"] == "ray"
        same_tables(here, out)
    finally:
        ray.shutdown()
