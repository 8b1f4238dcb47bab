"""The Ray executor: a local Ray instance (started by the test, 2 CPUs) runs a study's cells as
tasks into the same results directory, cache and manifest as the local executor, with the same
tables; a worker killed mid-cell is retried and nothing is lost. Skipped without Ray."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from tiny_study import tiny_study

from probe.errors import ProbeError
from probe.study.grid.spec import parse_study
from probe.study.runner import load_tables, run_study

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'probe[ray]')")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def same_tables(a: Path, b: Path) -> None:
    ta, tb = load_tables(a), load_tables(b)
    assert set(ta) == set(tb)
    for name in ta:
        if name == "train":  # the training log is the same but for nothing timed; compare values
            pd.testing.assert_series_equal(ta[name]["value"], tb[name]["value"])
            continue
        pd.testing.assert_frame_equal(ta[name], tb[name])


@pytest.mark.slow
def test_ray_gives_the_local_tables_and_reuses_the_cache(local_ray, tmp_path):
    study = parse_study(tomllib.loads(tiny_study(steps=6)))
    run_study(study, tmp_path / "local")
    result = run_study(study, tmp_path / "ray", executor="ray")
    assert [r.cached for r in result.records] == [False] * 4
    same_tables(tmp_path / "local", tmp_path / "ray")
    again = run_study(study, tmp_path / "ray", executor="ray")
    assert [r.cached for r in again.records] == [True] * 4  # never a cached cell again
    assert again.manifest["executor"] == "ray"


def _task_workers() -> list[int]:
    """Ray worker processes running a cell (Ray names them after the task)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ray::_ray_task" in text:
            pids.append(int(cmdline.parent.name))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc (Linux)")
def test_a_killed_worker_is_retried_and_nothing_is_lost(local_ray, tmp_path):
    study = parse_study(tomllib.loads(tiny_study(steps=400)))
    run_study(study, tmp_path / "local")
    done: dict = {}

    def run() -> None:
        try:
            done["result"] = run_study(study, tmp_path / "ray", executor="ray")
        except BaseException as exc:  # reported below
            done["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 120
    while not _task_workers():
        assert time.time() < deadline and thread.is_alive(), done.get("error")
        time.sleep(0.05)
    time.sleep(0.5)  # inside a cell
    victim = _task_workers()[0]
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=300)
    assert "error" not in done, done.get("error")
    assert len(done["result"].records) == 4
    same_tables(tmp_path / "local", tmp_path / "ray")


def test_missing_ray_is_one_line(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is missing
    study = parse_study(tomllib.loads(tiny_study(steps=2)))
    with pytest.raises(ProbeError, match=r"pip install 'probe\[ray\]'"):
        run_study(study, tmp_path / "x", executor="ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_an_address_nothing_answers_is_one_line_at_once(tmp_path, capsys, address):
    """A loopback port nothing listens on: refused before Ray is started, naming the address
    (it waited for ever before)."""
    from cli_run import exit_code

    address = address.format(port=_free_port())
    (tmp_path / "s.toml").write_text(tiny_study(steps=2))
    args = ["study", "run", str(tmp_path / "s.toml"), "--executor", "ray", "--address", address,
            "--out", str(tmp_path / "o"), "--device", "cpu"]  # fmt: skip
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and address in err and "nothing answers" in err
    assert not ray.is_initialized()


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:0", "127.0.0.1:http", ":6379"])
def test_an_address_that_is_not_host_port_is_one_line(address):
    from probe.study.engine.executors import check_ray

    with pytest.raises(ProbeError, match="is not HOST:PORT"):
        check_ray(address)


@pytest.mark.slow  # imports Ray in a process of its own, which waits INIT_S for the cluster
def test_a_port_that_answers_but_is_not_ray_fails_in_bounded_time(tmp_path):
    """A loopback port that accepts connections and says nothing: ray.init alone waits for
    ever; run_on_ray gives up after INIT_S (3 s here) with one line naming the address."""
    code = """
import socket, sys
import probe.study.engine.executors as ex
from probe.errors import ProbeError
from probe.study.engine import Settings
ex.INIT_S = 3
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
address = f"127.0.0.1:{server.getsockname()[1]}"
try:
    ex.run_on_ray(None, [], Settings("cpu", address=address), print, print)
except ProbeError as exc:
    print("refused:", exc, flush=True)
    sys.exit(2)
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "refused: --address 127.0.0.1:" in done.stdout and "within 3 s" in done.stdout


@pytest.mark.slow
def test_a_probe_error_in_a_cell_on_ray_is_one_line_naming_the_cell(local_ray, tmp_path):
    from probe.study.grid.cells import expand

    study = parse_study(tomllib.loads(tiny_study(steps=2)))
    out = tmp_path / "ray"
    run_study(study, out)
    bad = expand(study)[2]
    for done in out.glob("cells/*/done.json"):
        done.unlink()
    (out / "models" / bad.train_key / "config.json").write_text("{")  # a damaged cached model
    with pytest.raises(ProbeError) as failed:
        run_study(study, out, executor="ray")
    said = str(failed.value)
    assert said.startswith(f"cell {bad.index} ({bad.label}): ") and "\n" not in said, said
    assert "config.json is not valid JSON" in said
