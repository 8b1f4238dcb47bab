"""Plain mistakes are answered before torch is imported (so in well under a second on any
machine), and Click's usage errors are one line on stderr with exit code 2 like every other
error. Each case runs `probe` in a fresh interpreter, so no earlier import counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_run import in_fresh_interpreter
from probe_cli.main import app
from typer.testing import CliRunner

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.train_config import TrainConfig


def run_probe(args: list[str], cwd: Path) -> tuple[int, bool, list[str], str]:
    """`probe ARGS` in a fresh interpreter: exit code, whether torch was imported, the lines it
    wrote on stderr, and its stdout."""
    done = in_fresh_interpreter(args, cwd)
    return done.code, "torch" in done.heavy, done.said, done.out


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quick")
    torch.manual_seed(0)
    task = TaskConfig(name="copy", n_symbols=4)
    cfg = ModelConfig(vocab_size=task.vocab_size, n_layer=1, n_head=2, d_model=16)
    save_checkpoint(root / "ckpt", Transformer(cfg), task, TrainConfig(train_len=(2, 4)), {})
    (root / "afile").write_text("not a folder")
    (root / "empty").mkdir()
    (root / "bad.toml").write_text('name = "x"\n[base\n')
    return {"root": root, "ckpt": root / "ckpt", "afile": root / "afile",
            "empty": root / "empty", "bad": root / "bad.toml"}  # fmt: skip


# (command line with {ckpt} {afile} {empty} {bad} {out}, a fragment of the one-line message)
PLAIN = [
    ("train --out {afile}", "is a file"),
    ("train --out {out} --task cpoy", "Did you mean 'copy'?"),
    ("train --out {out} --seed -1", "--seed must be"),
    ("train --out {out} --train-len 0:3", "Invalid lengths"),
    ("eval nowhere --out {out}", "No checkpoint at 'nowhere'"),
    ("eval {ckpt} --out {out} --batches 0", "--batches must be at least 1"),
    ("eval {ckpt} --out {out} --text nowhere.txt", "No text file at nowhere.txt"),
    ("eval {ckpt} --out {out} --lengths 0", "Invalid lengths"),
    ("info nowhere", "No checkpoint at 'nowhere'"),
    ("info {empty}", "config.json is missing"),
    ("info {afile}", "is a file"),
    ("inspect nowhere --out {out}", "No checkpoint at 'nowhere'"),
    ("inspect {ckpt} --out {afile}", "is a file"),
    ("inspect {ckpt} --out {out} --streaming x", "--streaming must be"),
    ("inspect {ckpt} --out {out} --batch-size 0", "--batch-size must be at least 1"),
    ("scaling --out {out} --steps -1", "--steps must be 0"),
    ("scaling --out {out} --d-ks x", "--d-ks must be whole numbers"),
    ("import nowhere --out {out}", "Nothing to import at 'nowhere'"),
    ("export nowhere --out {out}", "No checkpoint at 'nowhere'"),
    ("export {ckpt} --out {out} --format x", "Unknown --format 'x'"),
    ("export {ckpt} --format gguf --out /dev/null --overwrite", "is a character device"),
    ("prune nowhere --out {out}", "No checkpoint at 'nowhere'"),
    ("prune {ckpt} --out {out} --fraction 1.5", "--fraction must be a share between 0 and 1"),
    ("prune {ckpt} --out {out} --method bogus", "Unknown importance method 'bogus'"),
    ("prune {ckpt} --out {out} --unit grop", "Did you mean 'group'?"),
    ("prune {ckpt} --out {out} --scope x", "Unknown pruning scope 'x'"),
    ("prune {ckpt} --out {out} --sweep --fractions 2", "--fractions must be numbers"),
    ("prune {ckpt} --out {out} --sweep --methods bogus", "Unknown importance method"),
    ("prune {ckpt} --out {ckpt}", "which this command reads"),
    ("prune {ckpt} --out {out} --seed -1", "--seed must be"),
    ("prune {ckpt} --out {out} --dtype bf17", "Unknown dtype 'bf17'"),
    ("importance nowhere --out {out}", "No checkpoint at 'nowhere'"),
    ("importance {ckpt} --out {out} --method bogus", "Unknown importance method 'bogus'"),
    ("importance {ckpt} --out {out} --unit x", "Unknown pruning unit 'x'"),
    ("importance {ckpt} --out {out} --nproc 0", "--nproc must be at least 1"),
    ("kv-plan nowhere --method duo --out {out}", "No checkpoint at 'nowhere'"),
    ("kv-plan {ckpt} --method x --out {out}", "Unknown --method 'x'"),
    ("kv-plan {ckpt} --method razr --out {out}", "Unknown --method 'razr'. Did you mean 'razor'?"),
    ("kv-plan {ckpt} --method duo --full-heads 2 --out {out}", "--full-heads must be a share"),
    ("kv-plan {ckpt} --method duo --out {afile}", "is a file"),
    ("generate nowhere --tokens 1,2", "No checkpoint at 'nowhere'"),
    ("generate {ckpt} --tokens 1,2 --max-new-tokens 0", "--max-new-tokens must be at least 1"),
    ("heal nowhere --teacher {ckpt} --out {out}", "No checkpoint at 'nowhere'"),
    ("heal {ckpt} --teacher nowhere --out {out}", "No checkpoint at 'nowhere'"),
    ("heal {ckpt} --teacher {ckpt} --out {out} --text nowhere.txt", "No text file at"),
    ("heal {ckpt} --teacher {ckpt} --out {out} --tokens 0", "--tokens must be a whole number"),
    ("heal {ckpt} --teacher {ckpt} --out {out} --schedule cosin", "Unknown --schedule 'cosin'"),
    ("heal {ckpt} --teacher {ckpt} --out {out} --lr nan", "--lr must be above 0"),
    ("view nowhere --out {out}.html", "nowhere does not exist"),
    ("view {ckpt} --out {out}.txt", "--out must name an .html file"),
    ("view {ckpt} --out {out}.html --importance bogus", "Unknown --importance 'bogus'"),
    ("eval {ckpt} --out {out} --rope-scaling lienar", "Did you mean 'linear'?"),
    ("eval {ckpt} --out {out} --rope-factor 2", "--rope-factor needs --rope-scaling"),
    ("inspect {ckpt} --out {out} --rope-scaling linear --rope-factor 0",
     "--rope-factor must be a finite number above 0"),
    ("generate {ckpt} --tokens 1,2 --rope-scaling linear --rope-factor nan",
     "--rope-factor must be a finite number above 0"),
    ("view {ckpt} --out {out}.html --rope-scaling linear --rope-factor 2",
     "has learned positions, not rotary"),
    ("study run nowhere.toml", "No study file at 'nowhere.toml'"),
    ("study run {bad}", "is not valid TOML"),
    ("study validate nowhere.toml", "No study file at 'nowhere.toml'"),
    ("study validate {bad}", "is not valid TOML"),
    ("study ls {empty}", "No study files"),
]  # fmt: skip


@pytest.mark.parametrize("template, fragment", PLAIN, ids=[p[0] for p in PLAIN])
def test_a_plain_mistake_is_answered_before_torch_is_imported(template, fragment, paths):
    out = paths["root"] / "outputs" / "o"
    args = template.format(out=out, **paths).split()
    code, imported, said, _ = run_probe(args, paths["root"])
    assert code == 2, said
    assert len(said) == 1 and said[0].startswith("error: "), said
    assert fragment in said[0], said
    assert not imported, f"probe {' '.join(args)} imported torch before its error"
    assert not (paths["root"] / "outputs").exists()  # the claim creates nothing


# (arguments, a fragment of the one line)
USAGE = [
    (["prune", "{ckpt}"], "Missing option '--out' / '-o'. (probe prune --help lists the options)"),
    (["prune", "{ckpt}", "--out", "o", "--bogus"], "No such option: --bogus"),
    (["prune", "{ckpt}", "--out", "o", "--fraction", "abc"], "Invalid value for '--fraction'"),
    (["study", "run"], "Missing argument"),
    (["prnue", "x"], "No such command 'prnue'. Did you mean 'prune'? (probe --help lists"),
    (["study", "runn", "x"], "Did you mean 'run'? (probe study --help lists the commands)"),
    (["generate", "{ckpt}", "--tokens"], "Option '--tokens' requires an argument"),
    (["--bogus"], "No such option: --bogus"),
]  # fmt: skip


@pytest.mark.parametrize("args, fragment", USAGE, ids=[" ".join(u[0]) for u in USAGE])
def test_a_usage_error_is_one_line_and_exit_code_2(args, fragment, paths):
    args = [a.format(**paths) for a in args]
    code, imported, said, out = run_probe(args, paths["root"])
    assert code == 2
    assert len(said) == 1 and said[0].startswith("error: "), said
    assert fragment in said[0], said
    assert out == "" and not imported
    result = CliRunner().invoke(app, args)  # the Typer app itself, as the tests call it
    assert result.exit_code == 2 and "╭" not in result.output and "Usage:" not in result.output


def test_a_usage_error_into_a_pipe_exits_2(paths):
    """Shells see the status through a pipe: `probe prune CKPT | cat` is not success."""
    done = subprocess.run([sys.executable, "-m", "probe_cli", "prune", str(paths["ckpt"])],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().startswith("error: Missing option '--out'")


@pytest.mark.parametrize("args", [["--help"], ["prune", "--help"], ["study", "--help"]])
def test_help_still_prints_and_exits_0(args, paths):
    code, _, said, out = run_probe(args, paths["root"])
    assert code == 0 and said == [] and "Usage: probe" in out


def test_version_still_prints_and_exits_0(paths):
    code, _, said, out = run_probe(["--version"], paths["root"])
    assert code == 0 and said == [] and out.startswith("probe ")


@pytest.mark.parametrize("args", [[], ["prune"], ["study"]])
def test_a_command_given_nothing_prints_its_help(args, paths):
    """As Click does since 8.2: the help on stdout, nothing on stderr, exit code 2 (a command
    that needs arguments was given none)."""
    code, _, said, out = run_probe(args, paths["root"])
    assert said == [] and "Usage: probe" in out and code == 2
