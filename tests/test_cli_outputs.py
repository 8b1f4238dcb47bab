"""Where commands write and what they run on, through the real entry point: no `--out` is, holds
or (for a command that writes a model) lies inside an input, links followed, with or without
--overwrite, and the input is byte for byte intact; `--out` under /proc or under a file is one
line for every command that writes; `--device auto` works everywhere and the manifest records
the device used; a bad device name is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from tiny_study import tiny_study

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.model import Transformer
from probe.train_config import TrainConfig

pytest.importorskip("transformers")

TASK = TaskConfig(name="copy", n_symbols=4)


def head_study(source: Path) -> str:
    return f"""
[study]
name = "outputs"
question = "Where may a head study write?"

[model]
source = "{source}"

[text]
max_tokens = 16
batch_size = 2
batches = 1
seeds = 1
"""


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("outputs")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=1, n_head=2, d_model=16, max_len=64)
    ck = save_checkpoint(root / "ck", Transformer(cfg), TASK, TrainConfig(train_len=(2, 4)), {})
    hf = hf_dir("llama", root)
    imported = root / "imp"
    assert exit_code(["import", str(hf), "--out", str(imported)]) == 0
    text = root / "page.html"
    text.write_text("some words of text\n" * 50)
    study = root / "heads.toml"
    study.write_text(head_study(hf))
    grid = root / "grid.toml"
    grid.write_text(tiny_study(steps=1, pes=("learned",)))
    afile = root / "afile"
    afile.write_text("x")
    found = {"ck": ck, "hf": hf, "imp": imported, "text": text, "study": study, "grid": grid,
             "afile": afile, "root": root}  # fmt: skip
    for name in ("ck", "hf", "imp"):
        link = root / f"link-{name}.html"  # .html: view takes it as the page to write
        link.symlink_to(found[name], target_is_directory=True)
        found[f"link-{name}"] = link
    return found


def snapshot(folder: Path) -> dict[str, bytes]:
    if folder.is_file():
        return {str(folder): folder.read_bytes()}
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys, fragment: str) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), captured.err
    assert fragment in " ".join(captured.err.split()), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


# (command, args with {x} the input and {out} the output, the input's key in `paths`)
READERS = [
    ("import", "import {x} --out {out} --overwrite", "hf"),
    ("export", "export {x} --out {out} --overwrite", "imp"),
    ("prune", "prune {x} --out {out} --overwrite --no-timing", "ck"),
    ("prune --sweep", "prune {x} --sweep --out {out} --overwrite", "ck"),
    ("inspect", "inspect {x} --out {out} --overwrite", "ck"),
    ("importance", "importance {x} --out {out} --overwrite", "ck"),
    ("eval", "eval {x} --out {out} --overwrite", "ck"),
    ("view", "view {x} --out {out} --overwrite", "ck"),
    ("study run", "study run {study} --out {out} --overwrite", "hf"),
]
MODEL_WRITERS = ("import", "export", "prune")  # a model never goes inside another one


def overlap_cases():
    for command, template, key in READERS:
        relations = ["link"] if command == "view" else ["is", "link", "holds"]  # a page: a file
        if command in MODEL_WRITERS:
            relations.append("lies inside")
        for relation in relations:
            yield pytest.param(template, key, relation, LABELS.get(command, ("CHECKPOINT",)),
                               id=f"{command}: --out {relation}")  # fmt: skip
    yield pytest.param("view {x} --text {text} --out {text} --overwrite", "imp", "text",
                       ("--text",), id="view: --out is its --text")  # fmt: skip


# how the refusal names the input it met: the option (or argument) the path came from
LABELS = {"import": ("SOURCE",), "study run": ("the study's input", "the study file")}


@pytest.mark.parametrize("template, key, relation, labels", list(overlap_cases()))
def test_no_output_is_an_input(template, key, relation, labels, paths, capsys):
    source = paths[key]
    out = {"is": source, "link": paths[f"link-{key}"], "holds": paths["root"],
           "lies inside": source / "sub", "text": paths["text"]}[relation]  # fmt: skip
    watched = paths["text"] if relation == "text" else source
    before = snapshot(watched)
    capsys.readouterr()
    args = template.format(x=source, out=out, **{k: v for k, v in paths.items() if k != "x"})
    assert exit_code(args.split()) == 2
    word = {"link": "is", "text": "is"}.get(relation, relation)
    line = one_line_error(capsys, f"{word} ")
    assert any(f"{word} {label} '" in line for label in labels), line
    assert "--overwrite never replaces an input" in line
    assert snapshot(watched) == before
    assert not (source / "sub").exists()


def test_results_may_go_in_a_folder_inside_the_checkpoint(paths, tmp_path):
    """The README's `probe eval runs/copy --out runs/copy/eval`: results beside the model,
    which stays as it was."""
    ck = paths["ck"]
    before = snapshot(ck)
    out = tmp_path / "ck-copy"
    import shutil

    shutil.copytree(ck, out)
    assert exit_code(["eval", str(out), "--lengths", "2", "--out", str(out / "eval")]) == 0
    assert (out / "eval" / "eval.csv").is_file()
    assert {k: v for k, v in snapshot(out).items() if "/eval/" not in k} == {
        k.replace(str(ck), str(out)): v for k, v in before.items()
    }


# every command that writes, with {out} where it writes
WRITERS = [
    ("train", "train --steps 1 --out {out}"),
    ("eval", "eval {ck} --out {out}"),
    ("inspect", "inspect {ck} --out {out}"),
    ("importance", "importance {ck} --out {out}"),
    ("prune", "prune {ck} --no-timing --out {out}"),
    ("prune --sweep", "prune {ck} --sweep --out {out}"),
    ("view", "view {ck} --out {out}.html"),
    ("scaling", "scaling --steps 0 --out {out}"),
    ("import", "import {hf} --out {out}"),
    ("export", "export {imp} --out {out}"),
    ("study run (grid)", "study run {grid} --out {out}"),
    ("study run (heads)", "study run {study} --out {out}"),
    ("study run --junit", "study run {grid} --out {root}/junit-run --junit {out}.xml"),
]
PLACES = {
    "under /proc": ("/proc/probe-out", "cannot be written"),
    "under a file": ("{afile}/sub", "which is a file"),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("template", [w[1] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_an_unwritable_out_is_one_line_before_any_work(template, place, paths, capsys):
    where, fragment = PLACES[place]
    out = where.format(**paths)
    capsys.readouterr()
    assert exit_code(template.format(out=out, **paths).split()) == 2
    one_line_error(capsys, fragment)
    assert not (paths["root"] / "junit-run").exists()


# every command with --device: its args, and where it records the device (file, keys)
WITH_DEVICE = [
    ("train", "train --steps 2 --layers 1 --heads 2 --d-model 16 --eval-every 0 --out {out}",
     ("config.json", ["meta", "device"])),
    ("eval", "eval {ck} --lengths 2 --out {out}", ("manifest.json", ["device"])),
    ("inspect", "inspect {ck} --lengths 4 --batches 1 --out {out}", ("manifest.json", ["device"])),
    ("importance", "importance {ck} --out {out}", ("manifest.json", ["device"])),
    ("prune", "prune {ck} --no-timing --out {out}",
     ("config.json", ["meta", "pruning", -1, "device"])),
    ("prune --sweep", "prune {ck} --sweep --seeds 1 --out {out}", ("manifest.json", ["device"])),
    ("view", "view {ck} --out {out}.html", None),
    ("scaling", "scaling --steps 1 --d-k 8 --d-ks 8 --ns 8 --queries 4 --stats-every 1 "
     "--train-len 2:3 --out {out}", ("manifest.json", ["device"])),
    ("study run", "study run {grid} --out {out}", ("manifest.json", ["device"])),
]  # fmt: skip


@pytest.mark.parametrize("template, record", [w[1:] for w in WITH_DEVICE],
                         ids=[w[0] for w in WITH_DEVICE])  # fmt: skip
def test_device_auto_works_and_the_device_used_is_recorded(template, record, paths, tmp_path):
    out = tmp_path / "out"
    assert exit_code([*template.format(out=out, **paths).split(), "--device", "auto"]) == 0
    if record is None:
        assert out.with_suffix(".html").is_file()
        return
    name, keys = record
    value = json.loads((out / name).read_text())
    for key in keys:
        value = value[key]
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert value.startswith(expected), value


BAD_DEVICES = [("gpu0", "Unknown device 'gpu0'"), ("cuda:x", "Unknown device 'cuda:x'")]
if not torch.cuda.is_available():
    BAD_DEVICES.append(("cuda", "torch sees no CUDA GPU"))


@pytest.mark.parametrize("device, fragment", BAD_DEVICES, ids=[d[0] for d in BAD_DEVICES])
@pytest.mark.parametrize("template", [w[1] for w in WITH_DEVICE], ids=[w[0] for w in WITH_DEVICE])
def test_a_bad_device_is_one_line(template, device, fragment, paths, tmp_path, capsys):
    out = tmp_path / "out"
    capsys.readouterr()
    assert exit_code([*template.format(out=out, **paths).split(), "--device", device]) == 2
    one_line_error(capsys, fragment)
    assert not out.exists() and not out.with_suffix(".html").exists()


@pytest.fixture(scope="module")
def big_text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.txt"
    line = b"the quick brown fox jumps over the lazy dog and returns a value\n"
    path.write_bytes(line * (60_000_000 // len(line)))
    return path


@pytest.mark.parametrize("whole", [False, True], ids=["lines", "--whole"])
def test_a_60_mb_text_is_read_only_as_far_as_shown(whole, big_text, paths, tmp_path, capsys):
    out = tmp_path / "v.html"
    args = ["view", str(paths["imp"]), "--text", str(big_text), "--out", str(out)]
    capsys.readouterr()
    assert exit_code(args + (["--whole"] if whole else [])) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "is 57.2 MiB: only its first 4 MiB" in shown and out.is_file()


# requests too large to hold: (args, what the message must count); ck trains on lengths 2-4
HUGE = [
    ("importance {imp} --max-tokens 1000000000", "2 batches of 64 sequences of 1,000,000,000"),
    ("prune {imp} --no-timing --max-tokens 1000000000", "of 1,000,000,000 tokens"),
    ("prune {ck} --timing-sizes 10000000", "1 batch of 10,000,000 sequences"),
    ("importance {ck} --batches 1000000000", "6,000,000,000 batches of 64 sequences"),
    ("prune {ck} --sweep --seeds 3 --batches 1000000000", "12,000,000,000 batches"),
    ("inspect {ck} --lengths 8 --batches 1000000000", "1,000,000,000 batches of 32 sequences"),
    ("inspect {imp} --lengths 1000000000", "of 1,000,000,000 tokens"),
    ("eval {ck} --lengths 2 --batches 1000000000", "1,000,000,000 batches of 64 sequences"),
    ("eval {imp} --lengths 1000000000", "2 batches of 64 sequences of 1,000,000,000 tokens"),
    ("view {ck} --batches 1000000000", "1,000,000,000 batches of 16 sequences"),
]  # fmt: skip


@pytest.mark.parametrize("template, counted", HUGE, ids=[h[0].split(" {")[0] + h[0].split("}")[1]
                                                         for h in HUGE])  # fmt: skip
def test_work_too_large_to_hold_is_refused_before_any_batch(template, counted, paths, tmp_path,
                                                            capsys):  # fmt: skip
    out = tmp_path / ("v.html" if template.startswith("view") else "out")
    capsys.readouterr()
    assert exit_code([*template.format(**paths).split(), "--out", str(out)]) == 2
    line = one_line_error(capsys, counted)
    assert "would need about" in line and "use a smaller --" in line
    assert not out.exists()


# too little text: each command's message names the options it takes (inspect has no --max-tokens)
TOO_LITTLE = [
    ("inspect {imp} --text {tiny}", "--lengths", "--max-tokens"),
    ("inspect {imp} --text {tiny} --lengths 8", "--lengths", "--max-tokens"),
    ("eval {imp} --text {tiny}", "--lengths", "--max-tokens"),
    ("view {imp} --text {tiny}", "--length", "--max-tokens"),
    ("importance {imp} --text {tiny}", "--max-tokens", "--lengths"),
    ("prune {imp} --no-timing --text {tiny} --max-tokens 8", "--max-tokens", "--lengths"),
]


LITTLE_IDS = [t[0].replace(" {imp}", "").replace(" {tiny}", "") for t in TOO_LITTLE]


@pytest.mark.parametrize("template, named, foreign", TOO_LITTLE, ids=LITTLE_IDS)
def test_too_little_text_names_the_options_the_command_takes(template, named, foreign, paths,
                                                             tmp_path, capsys):  # fmt: skip
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a few words of text\nand a few more\n")
    out = tmp_path / ("v.html" if template.startswith("view") else "out")
    capsys.readouterr()
    args = [*template.format(tiny=tiny, **paths).split(), "--out", str(out)]
    assert exit_code(args) == 2
    line = one_line_error(capsys, "give more text (--text)")
    assert named in line and foreign not in line
    if "--batches" in line:  # too few rows: every count it takes
        assert "--batch-size" in line


def test_a_table_printed_to_a_pipe_has_every_number_in_full(paths, tmp_path):
    """Not a terminal (CliRunner, a pipe, a log): the 8-column table of Spearman correlations is
    printed whole, each cell the number correlations.csv holds, none cut to `0.…` at 80
    columns."""
    import pandas as pd
    from probe_cli.main import app
    from typer.testing import CliRunner

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["importance", str(paths["ck"]), "--method", "all",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    rho = pd.read_csv(out / "correlations.csv").pivot(index="method", columns="other",
                                                      values="rho")  # fmt: skip
    printed = {}
    for line in result.output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] in rho.index and len(cells) == len(rho) + 1:
            printed[cells[0]] = cells[1:]
    header = next(line for line in result.output.splitlines() if "mean-ablation ┃" in line)
    order = [c.strip() for c in header.split("┃")[2:-1]]
    assert set(printed) == set(rho.index) and set(order) == set(rho.index)
    for method, cells in printed.items():
        assert cells == [f"{rho.loc[method, other]:.2f}" for other in order], method
    assert max(map(len, result.output.splitlines())) > 80


def test_counts_in_messages_take_the_number_of_their_noun(paths, tmp_path, capsys):
    from probe.words import counted

    assert [counted(n, "head") for n in (0, 1, 2, 1000)] == ["0 heads", "1 head", "2 heads",
                                                             "1,000 heads"]  # fmt: skip
    assert [counted(n, "batch") for n in (1, 3)] == ["1 batch", "3 batches"]
    capsys.readouterr()
    assert exit_code(["prune", str(paths["ck"]), "--fraction", "0.5", "--no-timing",
                      "--out", str(tmp_path / "pruned")]) == 0  # fmt: skip
    assert exit_code(["train", "--steps", "1", "--layers", "1", "--heads", "1", "--d-model", "8",
                      "--eval-every", "0", "--out", str(tmp_path / "one")]) == 0  # fmt: skip
    printed = " ".join(capsys.readouterr().out.split())
    assert "before / after pruning 1 of 2 heads (50%)" in printed
    assert "1 layer x 1 head, d_model 8" in printed and "for 1 step ->" in printed
    assert " 1 heads" not in printed and " 1 layers" not in printed
