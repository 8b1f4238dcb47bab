"""`--nproc N`: every option is checked before any process starts (a bad one is one line and
exit 2, with no process started), no more processes than the machine holds, a failed rank is
reported in its own one line with its exit status, and no rank outlives a killed launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import exit_code
from processes import alive, children, snapshot, wait_until

import probe.training.launch
from probe.training.launch import Outcome, cpu_cores, launch

TESTS = Path(__file__).parent
TINY = ["--steps", "2", "--layers", "1", "--heads", "2", "--d-model", "16", "--batch-size", "4",
        "--eval-every", "0", "--train-len", "2:4", "--device", "cpu"]  # fmt: skip


@pytest.fixture
def launches(monkeypatch):
    """Record each launch instead of starting processes; the launch succeeds."""
    calls: list[tuple[list[str], int]] = []

    def fake(args, nproc, module=probe.training.launch.MODULE):
        calls.append((list(args), nproc))
        return Outcome(0, 0, "")

    monkeypatch.setattr(probe.training.launch, "launch", fake)
    return calls


def run(monkeypatch, args: list[str]) -> int:
    """`probe ARGS...` in this process, with ARGS as the command line the launcher repeats."""
    monkeypatch.setattr(sys, "argv", ["probe", *args])
    return exit_code(args)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("launch") / "ckpt"
    assert exit_code(["train", *TINY, "--out", str(out)]) == 0
    return out


def test_more_processes_than_cores_are_refused_unless_asked(launches, monkeypatch, tmp_path,
                                                           capsys):  # fmt: skip
    cores = cpu_cores()
    many = cores + 97
    args = ["train", *TINY, "--batch-size", str(4 * many), "--out", str(tmp_path / "o")]
    assert run(monkeypatch, [*args, "--nproc", str(many)]) == 2
    err = one_line(capsys)
    assert f"--nproc {many}" in err and f"{cores} CPU cores" in err and "--oversubscribe" in err
    assert launches == []
    few = cores + 1  # a count the memory holds: started when asked
    args = ["train", *TINY, "--batch-size", str(4 * few), "--out", str(tmp_path / "o")]
    assert run(monkeypatch, [*args, "--nproc", str(few), "--oversubscribe"]) == 0
    assert [n for _, n in launches] == [few]
    assert "--nproc" not in launches[0][0]  # the ranks run the command without it


TRAIN_BAD = {
    "task": (["--task", "copyy"], "copyy"),
    "out under a file": (["--out", "{file}/o"], "is a file"),
    "batch split": (["--batch-size", "5"], "does not split over 2"),
    "positions": (["--max-len", "4"], "positional table"),
    "train-len": (["--train-len", "2:x"], "2:x"),
    "device": (["--device", "tpu"], "tpu"),
}


@pytest.mark.parametrize("extra, expected", TRAIN_BAD.values(), ids=TRAIN_BAD.keys())
def test_bad_train_options_fail_before_launching(launches, monkeypatch, tmp_path, capsys, extra,
                                                 expected):  # fmt: skip
    (tmp_path / "f").write_text("x")
    extra = [a.format(file=tmp_path / "f") for a in extra]
    args = ["train", *TINY, "--out", str(tmp_path / "o"), *extra, "--nproc", "2"]
    assert run(monkeypatch, args) == 2
    assert expected in one_line(capsys)
    assert launches == []
    assert not (tmp_path / "o").exists()


def test_good_options_launch(launches, monkeypatch, tmp_path, ckpt):
    assert run(monkeypatch, ["train", *TINY, "--out", str(tmp_path / "t"), "--nproc", "2"]) == 0
    args = ["importance", str(ckpt), "--out", str(tmp_path / "i"), "--nproc=2"]
    assert run(monkeypatch, args) == 0
    assert [n for _, n in launches] == [2, 2]
    assert launches[1][0] == ["importance", str(ckpt), "--out", str(tmp_path / "i")]
    assert not (tmp_path / "t").exists() and not (tmp_path / "i").exists()  # the ranks write


IMPORTANCE_BAD = {
    "lengths": (["--lengths", "x"], "'x'"),
    "lengths too long": (["--lengths", "1000"], "positional table"),
    "text for a task model": (["--text", "{file}"], "--text"),
    "out under a file": (["--out", "{file}/o"], "is a file"),
    "checkpoint": (["{missing}"], "missing"),
    "too many": (["--nproc", "99"], "--nproc 99"),
}


@pytest.mark.parametrize("extra, expected", IMPORTANCE_BAD.values(), ids=IMPORTANCE_BAD.keys())
def test_bad_importance_options_fail_before_launching(launches, monkeypatch, tmp_path, capsys,
                                                      ckpt, extra, expected):  # fmt: skip
    (tmp_path / "f").write_text("x")
    extra = [a.format(file=tmp_path / "f", missing=tmp_path / "missing") for a in extra]
    source = [] if str(tmp_path / "missing") in extra else [str(ckpt)]
    args = ["importance", *source, "--out", str(tmp_path / "o"), "--nproc", "2", *extra]
    assert run(monkeypatch, args) == 2
    assert expected in one_line(capsys)
    assert launches == []


REPORTS = {
    "user error": (Outcome(2, 1, "UserWarning: x\nerror: rank said so\n"), 2,
                   "error: rank said so\n"),
    "crash": (Outcome(-signal.SIGKILL, 1, "a warning\n"), 1,
              "error: rank 1 was killed by SIGKILL (out of memory?)\n"),
    "other": (Outcome(1, 0, "error: ValueError: v (run with --debug for the traceback)\n"), 1,
              "error: ValueError: v (run with --debug for the traceback)\n"),
}  # fmt: skip


@pytest.mark.parametrize("outcome, code, said", REPORTS.values(), ids=REPORTS.keys())
def test_a_failed_rank_is_one_line_and_its_exit_status(monkeypatch, tmp_path, capsys, outcome,
                                                       code, said):  # fmt: skip
    monkeypatch.setattr(probe.training.launch, "launch", lambda args, nproc: outcome)
    assert run(monkeypatch, ["train", *TINY, "--out", str(tmp_path / "o"), "--nproc", "2"]) == code
    assert capsys.readouterr().err == said


def _rank_env(monkeypatch) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )


def _pids(folder: Path, n: int) -> list[int]:
    assert wait_until(lambda: len(list(folder.iterdir())) == n, 120), "the ranks did not start"
    return [int((folder / str(r)).read_text()) for r in range(n)]


@pytest.mark.slow  # starts two Python processes that import torch
def test_the_first_failure_is_reported_and_the_other_ranks_stopped(monkeypatch, tmp_path):
    _rank_env(monkeypatch)
    outcome = launch([str(tmp_path), "fail", "1", "2"], 2, module="launch_rank")
    assert (outcome.code, outcome.rank) == (2, 1)
    assert outcome.stderr == "a warning\nerror: rank 1 found a bad input\n"
    assert not any(alive(p) for p in _pids(tmp_path, 2))  # rank 0 waited for ever: stopped


@pytest.mark.slow  # starts three Python processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc or psutil")
def test_ranks_die_with_a_killed_launcher(monkeypatch, tmp_path):
    _rank_env(monkeypatch)
    code = ("import sys; from probe.training.launch import launch; "
            "launch([sys.argv[1], 'sleep'], 2, module='launch_rank')")  # fmt: skip
    launcher = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    ranks: list[int] = []
    try:
        ranks = _pids(tmp_path, 2)
        assert sorted(children(launcher.pid)) == sorted(ranks)  # no agent in between
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not any(alive(p) for p in ranks), 5), "a rank outlived it"
    finally:
        _kill(launcher, ranks)


def _kill(launcher: subprocess.Popen, pids: list[int]) -> None:
    """What a failed test leaves running: the launcher and the ranks it started."""
    launcher.kill()
    launcher.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # trains in two processes until killed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc or psutil")
def test_kill_9_of_probe_train_leaves_no_rank_writing(tmp_path):
    out = tmp_path / "ddp"
    command = [sys.executable, "-m", "probe_cli.main", "train", *TINY, "--steps", "1000000",
               "--eval-every", "5", "--out", str(out), "--nproc", "2"]  # fmt: skip
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        assert wait_until(lambda: (out / "metrics.csv").exists(), 180), "training never wrote"
        ranks = children(launcher.pid)
        assert len(ranks) == 2
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not any(alive(p) for p in ranks), 5), "a rank outlived it"
        before = snapshot(out)
        assert wait_until(lambda: snapshot(out) != before, 3) is False  # --out stopped changing
    finally:
        _kill(launcher, ranks)


def test_cuda_takes_one_gpu_per_process_even_when_oversubscribing(monkeypatch):
    import torch

    from probe.errors import ProbeError
    from probe.training.launch import check_process_count

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ProbeError, match="--nproc 2 on CUDA needs one GPU per process, but torch "
                       "sees 1"):  # fmt: skip
        check_process_count(2, torch.device("cuda"), oversubscribe=True)
    check_process_count(1, torch.device("cuda"))
    check_process_count(cpu_cores() + 1, torch.device("cpu"), oversubscribe=True)
