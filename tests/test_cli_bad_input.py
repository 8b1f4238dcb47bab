"""Every bad input of the reliability review, through the real entry point: the exit code, a
fragment of the one-line message, no traceback, and nothing outside the command's own output
changed on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from safetensors.torch import load_file, save_file
from tiny_study import tiny_study

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.train_config import TrainConfig

TASK = TaskConfig(name="copy", n_symbols=4)


def make_checkpoint(path: Path, **kw) -> Path:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=1, n_head=2, d_model=16, **kw)
    return save_checkpoint(path, Transformer(cfg), TASK, TrainConfig(train_len=(2, 4)), {})


def edit_config(path: Path, section: str, **values) -> Path:
    doc = json.loads((path / "config.json").read_text())
    target = doc if section == "" else doc[section]
    target.update(values)
    (path / "config.json").write_text(json.dumps(doc))
    return path


def edit_weights(path: Path, change) -> Path:
    state = load_file(str(path / "model.safetensors"))
    save_file({k: change(v) for k, v in state.items()}, str(path / "model.safetensors"))
    return path


def snapshot(root: Path, skip: Path | None) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and (skip is None or skip not in p.parents)
    }


def study_file(root: Path, text: str, name: str = "s.toml") -> Path:
    path = root / name
    path.write_text(text)
    return path


def setup(root: Path) -> dict[str, Path]:
    """The checkpoints and files the cases use, made once per test in `root`."""
    good = make_checkpoint(root / "good")
    other = make_checkpoint(root / "other")
    (other / "metrics.csv").write_text("step,split\n")
    paths = {"good": good, "other": other}
    paths["two"] = edit_config(make_checkpoint(root / "two"), "model", n_head="two")
    paths["float"] = edit_config(make_checkpoint(root / "float"), "model", d_model=32.5)
    paths["null"] = edit_config(make_checkpoint(root / "null"), "model", d_model=None)
    paths["heads5"] = edit_config(make_checkpoint(root / "heads5"), "model", heads=5)
    paths["version"] = edit_config(make_checkpoint(root / "version"), "", format_version=99)
    paths["vocab"] = edit_config(make_checkpoint(root / "vocab"), "task", n_symbols=40)
    paths["huge"] = edit_config(make_checkpoint(root / "huge"), "model", d_model=10**9, n_head=1)
    paths["int64"] = edit_weights(make_checkpoint(root / "int64"), lambda t: t.to(torch.int64))
    paths["nan"] = edit_weights(make_checkpoint(root / "nan"), lambda t: t * float("nan"))
    paths["empty"] = make_checkpoint(root / "empty", kept_heads=((),))
    paths["rope"] = make_checkpoint(root / "rope", pe="rope")
    pickled = root / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((good / "config.json").read_text())
    (pickled / "model.pt").write_bytes(b"\x80\x04cos\nsystem\n(S'echo pwned'\ntR.")
    paths["pickled"] = pickled
    (root / "afile").write_text("x")
    paths["afile"] = root / "afile"
    results = root / "results_first"
    study = study_file(root, tiny_study(steps=1).replace('name = "tiny"', 'name = "first"'),
                       "first.toml")  # fmt: skip
    assert exit_code(["study", "run", str(study), "--out", str(results)]) == 0
    paths["results_first"] = results
    mine = root / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    (mine / ".notes.tmp").write_text("keep")
    paths["mine"] = mine
    paths["study"] = study_file(root, tiny_study(steps=1))
    paths["binary"] = root / "binary.toml"
    paths["binary"].write_bytes(b"\xff\xfe\x00binary")
    for key, text in {
        "big": tiny_study().replace("d_model = 16", 'd_model = "big"'),
        "range": tiny_study().replace("train_len = [2, 3]", 'train_len = "2:5"'),
        "steps": tiny_study(steps=4).replace("steps = 4", 'steps = "50"'),
        "absname": tiny_study().replace('name = "tiny"', 'name = "/tmp/evil"'),
        "dotname": tiny_study().replace('name = "tiny"', 'name = "../evil"'),
        "evl": tiny_study(extra='[[expect]]\ntable = "evl"\nmetric = "loss"\nbound = "<= 9"\n'),
    }.items():
        paths[key] = study_file(root, text, f"{key}.toml")
    return paths


# (id, args with {name} for paths made by `setup` and {out} for this case's output, exit code,
#  fragment of the message)
CASES = [
    ("export a trained model", "export {good} --out {out}", 2,
     "was trained by probe, not imported"),
    ("tune without fisher", "prune {good} --out {out} --tune --no-timing", 2, "--method fisher"),
    ("layer unit and uniform", "prune {good} --out {out} --unit layer --uniform --no-timing", 2,
     "do not combine"),
    ("needles on a task model", "inspect {good} --out {out} --needles 2", 2,
     "imported causal language model"),
    ("text on a task model", "importance {good} --out {out} --text {good}", 2,
     "--text is for imported"),
    ("unknown pruning unit", "prune {good} --out {out} --unit grop --no-timing", 2,
     "Did you mean 'group'?"),
    ("prune over its source", "prune {good} --out {good} --no-timing", 2,
     "is CHECKPOINT"),
    ("prune over another checkpoint", "prune {good} --out {other} --no-timing", 2,
     "already holds model.safetensors, config.json, metrics.csv"),
    ("study into another study's results", "study run {study} --out {results_first}", 2,
     "holds the results of study 'first'"),
    ("study into the user's folder", "study run {study} --out {mine}", 2,
     "not a results directory"),
    ("study name an absolute path", "study validate {absname}", 2, "name"),
    ("study name with ..", "study validate {dotname}", 2, "name"),
    ("n_head a string", "eval {two} --out {out}", 2, "'n_head' must be an integer"),
    ("d_model a float", "eval {float} --out {out}", 2, "'d_model' must be an integer"),
    ("d_model null", "eval {null} --out {out}", 2, "'d_model'"),
    ("heads a number", "eval {heads5} --out {out}", 2, "'heads'"),
    ("format_version 99", "info {version}", 2, "format_version 99"),
    ("task vocabulary too large", "eval {vocab} --out {out}", 2, "needs 45 tokens"),
    ("int64 weights", "eval {int64} --out {out}", 2, "floating point"),
    ("NaN weights", "inspect {nan} --out {out}", 2, "NaN or infinite"),
    ("model too large for memory", "info {huge}", 2, "of memory"),
    ("train model too large", "train --d-model 1000000000 --heads 1 --out {out}", 2,
     "of memory"),
    ("learned table too large", "train --max-len 20000000 --out {out}", 2, "of memory"),
    ("evaluation too long for memory", "eval {rope} --lengths 100000 --out {out}", 2,
     "of memory"),
    ("every head pruned: inspect", "inspect {empty} --out {out}", 2, "nothing to measure"),
    ("every head pruned: importance", "importance {empty} --out {out}", 2,
     "nothing to measure"),
    ("every head pruned: prune", "prune {empty} --out {out} --no-timing", 2,
     "nothing to measure"),
    ("--batches 0", "eval {good} --batches 0 --out {out}", 2, "--batches must be at least 1"),
    ("--period 0", "inspect {good} --period 0 --out {out}", 2, "--period must be at least 1"),
    ("--timing-threads 0", "prune {good} --timing-threads 0 --out {out}", 2,
     "--timing-threads must be at least 1"),
    ("--out an existing file", "eval {good} --out {afile}", 2, "is a file"),
    ("--out under a file", "eval {good} --out {afile}/sub", 2, "is under"),
    ("--out unwritable", "train --steps 2 --out /proc/x", 2, "cannot be written"),
    ("train --out an existing file", "train --steps 2 --out {afile}", 2, "is a file"),
    ("study file binary", "study validate {binary}", 2, "not a text file"),
    ("study d_model a string", "study validate {big}", 2, "'d_model'"),
    ("study train_len a string", "study validate {range}", 2, "'train_len'"),
    ("study steps a string", "study validate {steps}", 2, "'steps'"),
    ("expectation on a table never written", "study validate {evl}", 2, "Did you mean 'eval'"),
    ("validate checks every file", "study validate {big} {study} {binary}", 2,
     "2 of 3 study files are invalid"),
    ("pickle refused", "info {pickled}", 2, "--allow-pickle only if you trust"),
    ("malicious pickle allowed", "info {pickled} --allow-pickle", 2,
     "asks to run os.system when loaded"),
    ("a path with brackets is printed as written", "info no[/such]dir[ray]", 2,
     "No checkpoint at 'no[/such]dir[ray]'"),
    ("divergence claims no checkpoint", "train --lr 1e6 --warmup 1 --steps 30 --eval-every 5 "
     "--out {out}", 2, "no checkpoint was written"),
]  # fmt: skip


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    return root, setup(root)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line(case, made, capsys):
    root, paths = made
    name, template, code, fragment = case
    out = root / "outputs" / name.replace(" ", "_")
    args = template.format(out=out, **paths).split()
    capsys.readouterr()
    before = snapshot(root, out)
    assert exit_code(args) == code
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert fragment in " ".join(text.split()), text
    assert "Traceback" not in text
    lines = 3 if name == "validate checks every file" else 1  # a line per bad file, then the sum
    assert len([line for line in captured.err.splitlines() if line.strip()]) == lines, captured.err
    assert "error:" in captured.err and "weights_only" not in captured.err
    assert snapshot(root, out) == before  # nothing outside the command's own output changed


def test_the_pickle_payload_never_ran(made):
    root, paths = made
    assert exit_code(["info", str(paths["pickled"]), "--allow-pickle"]) == 2
    assert not (root / "pwned").exists()
