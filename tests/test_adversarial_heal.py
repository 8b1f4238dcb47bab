"""What an adversarial pass over `probe heal`, `probe export --format gguf` and a head study's
[heal] section found (issue 36), each kept as a case: a 300 MB --text read whole (the tokenizer
aborted the process), resume states that cannot be resumed (a step past the end, damaged rows,
a file or a link where the folder goes: each one line naming it and --overwrite, and left as it
was), an --out refusal that did not say which option the input came from, two runs into one
--out, Ctrl-C's message, an --out that is a device (--overwrite renamed a file over /dev/full), a
killed GGUF export's temporary file left for good, a full disk, and a study's heal step resuming
a state saved for another pruned model."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import test_gguf_export
import test_heal
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint
from probe.data.text import READ_LIMIT
from probe.errors import Interrupted
from probe.heal.state import STATE, holding

pytest.importorskip("transformers")

pair = test_heal.pair  # the fixture: a tiny imported Llama and a copy pruned at random
tiny = test_gguf_export.tiny  # the fixture: a tiny imported Llama with a byte-level BPE tokenizer

SMALL = ["--tokens", "512", "--seq-len", "16", "--batch-tokens", "128", "--eval-tokens", "64",
         "--lr", "3e-3", "--device", "cpu"]  # fmt: skip  # 4 steps, measured after 1, 2, 4


def heal_args(pair, out, *extra) -> list[str]:
    teacher, student, root = pair
    return ["heal", str(student), "--teacher", str(teacher), *SMALL, "--text",
            str(root / "train.txt"), "--eval-text", str(root / "heldout.txt"), "--out", str(out),
            *extra]  # fmt: skip


def one_line(capsys, *words) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    flat = " ".join(err.split())
    assert lines and lines[0].startswith("error:") and "Traceback" not in err, err
    for word in words:
        assert word in flat, (word, flat)
    return flat


def snapshot(folder: Path) -> dict:
    """Every file under `folder` (links not followed) with its bytes."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                         else os.readlink(p) if p.is_symlink() else None)
            for p in sorted(folder.rglob("*"))}  # fmt: skip


def stopped(pair, out, monkeypatch, *extra) -> Path:
    """A heal run stopped by Ctrl-C after its save at step 1 (the second step's measurement is
    interrupted): its output folder."""
    import probe.heal.loop as loop

    real, calls = loop.perplexity, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # original, pruned, step 1, then step 2's
            raise Interrupted()
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(loop, "perplexity", interrupted)
        assert exit_code(heal_args(pair, out, *extra)) == 130
    assert json.loads((out / STATE / "state.json").read_text())["step"] == 1
    return out


@pytest.fixture(scope="module")
def saved(pair, tmp_path_factory):
    """A resume state at step 1, made once and copied by each case."""
    out = tmp_path_factory.mktemp("saved") / "out"
    with pytest.MonkeyPatch.context() as m:
        stopped(pair, out, m)
    return out


def _edit(out: Path, **fields) -> None:
    path = out / STATE / "state.json"
    document = json.loads(path.read_text())
    document.update(fields)
    path.write_text(json.dumps(document))


def _past_end(out: Path) -> None:  # a state naming step 99 of this 4-step run, files and all
    _edit(out, step=99)
    for stem in ("student", "optimizer"):
        (out / STATE / f"{stem}-1.safetensors").rename(out / STATE / f"{stem}-99.safetensors")


def _truncated(out: Path) -> None:
    path = out / STATE / "student-1.safetensors"
    path.write_bytes(path.read_bytes()[:300])


DAMAGED = [
    ("step past the end", _past_end, "its step is 99, not one of 1..3"),  # was: exit 0, untrained
    ("step -1", lambda o: _edit(o, step=-1), "its step is -1"),
    ("rows not rows", lambda o: _edit(o, rows=[1, 2]), "its measured rows"),  # AttributeError
    ("rows of other keys", lambda o: _edit(o, rows=[{"x": 1}]), "its measured rows"),  # IndexError
    ("losses of other keys", lambda o: _edit(o, losses=[{"y": 2}]), "its losses"),  # silent
    ("weights cut short", _truncated, "student-1.safetensors is not a readable"),
    (
        "state.json not JSON",
        lambda o: (o / STATE / "state.json").write_text("{x"),
        "cannot be read",
    ),
]


@pytest.mark.parametrize("mutate, words", [pytest.param(m, w, id=i) for i, m, w in DAMAGED])
def test_a_state_that_cannot_resume_is_one_line_kept_and_discarded_only_by_overwrite(
    pair, saved, tmp_path, capsys, mutate, words
):
    out = tmp_path / "out"
    shutil.copytree(saved, out)
    mutate(out)
    before = snapshot(out)
    capsys.readouterr()
    assert exit_code(heal_args(pair, out)) == 2
    one_line(capsys, str(out / STATE), words, "it is kept: pass --overwrite to discard it")
    assert snapshot(out) == before  # refused: nothing changed, the state is still there
    assert exit_code(heal_args(pair, out, "--lr", "1e-3")) == 2  # other options: kept too
    assert snapshot(out) == before
    assert exit_code(heal_args(pair, out, "--overwrite")) == 0  # the way to discard it
    assert not (out / STATE).exists() and (out / "heal.csv").is_file()


def test_other_settings_are_refused_saying_how_to_discard_the_state(pair, saved, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(saved, out)
    before = snapshot(out)
    capsys.readouterr()
    assert exit_code(heal_args(pair, out, "--lr", "1e-3")) == 2
    one_line(capsys, "other settings (lr: 0.003, now 0.001)", "--overwrite to discard it")
    assert snapshot(out) == before


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_resume_folder_that_is_not_heals_is_left_alone(pair, tmp_path, capsys, kind):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    if kind == "file":  # was: FileExistsError at the first save, --overwrite or not
        (out / STATE).write_text("mine")
    else:  # was: the state written into the link's target, and left there
        (out / STATE).symlink_to(elsewhere)
    before, theirs = snapshot(out), snapshot(elsewhere)
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert exit_code(heal_args(pair, out, *extra)) == 2
        one_line(capsys, str(out / STATE), "not heal's resume state")
        assert snapshot(out) == before and snapshot(elsewhere) == theirs


@pytest.mark.parametrize(
    "where, words",
    [
        (lambda t, s, r: t, "is --teacher"),
        (lambda t, s, r: s / "healed", "lies inside CHECKPOINT"),
        (lambda t, s, r: r / "train.txt", "is --text"),
        (lambda t, s, r: r / "heldout.txt", "is --eval-text"),
    ],
    ids=["teacher", "inside the student", "the text", "the held-out text"],
)
def test_an_out_refused_as_an_input_names_the_option(pair, capsys, where, words):
    out = where(*pair)
    capsys.readouterr()
    assert exit_code(heal_args(pair, out)) == 2
    one_line(capsys, f"--out '{out}' {words} '", "--overwrite never replaces an input")


def test_a_second_run_into_the_same_out_is_refused(pair, tmp_path, capsys):
    out = tmp_path / "out"
    with holding(out):  # a run writing there now (an flock, as another process holds it)
        capsys.readouterr()
        assert exit_code(heal_args(pair, out)) == 2
        one_line(capsys, f"another `probe heal` is writing to {out}")
        assert [p.name for p in out.iterdir()] == [STATE]
    assert not out.joinpath(STATE).exists()  # nothing was saved: the empty folder goes


def test_ctrl_c_says_what_is_kept_and_the_rerun_ends_at_the_same_weights(
    pair, tmp_path, capsys, monkeypatch
):
    whole = tmp_path / "whole"
    assert exit_code(heal_args(pair, whole)) == 0
    out = tmp_path / "stopped"
    capsys.readouterr()
    stopped(pair, out, monkeypatch)  # was: "what was already written is kept"
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"healing stopped at step 2 of 4; the resume state of step 1 is kept in {out / STATE}"
        in err
    ), err
    assert exit_code(heal_args(pair, out)) == 0
    a, b = load_checkpoint(whole).model, load_checkpoint(out).model
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert (whole / "heal.csv").read_text() == (out / "heal.csv").read_text()


def test_a_killed_overwrite_run_resumes_with_the_same_command(pair, tmp_path, capsys, monkeypatch):
    """Was: --overwrite removed the state before anything else, so the same command (with
    --overwrite: the earlier results are still there) started again from step 0 each time.
    A state of these very settings resumes to a fresh run's weights; --overwrite discards only
    one it cannot resume."""
    whole = tmp_path / "whole"
    assert exit_code(heal_args(pair, whole)) == 0
    out = tmp_path / "out"
    assert exit_code(heal_args(pair, out, "--lr", "1e-3")) == 0  # an earlier run's results
    stopped(pair, out, monkeypatch, "--overwrite")
    capsys.readouterr()
    assert exit_code(heal_args(pair, out, "--overwrite")) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"resumed the heal run saved in {out} at step 1 of 4" in said, said
    a, b = load_checkpoint(whole).model, load_checkpoint(out).model
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert (whole / "heal.csv").read_text() == (out / "heal.csv").read_text()


def test_text_is_read_as_its_first_4_mib_as_every_command_reads_it(pair, tmp_path, capsys):
    """Was: 256 MB read and tokenized as one string (a 300 MB file: SIGABRT in the tokenizer).
    Now a large file heals exactly as a file holding its first READ_LIMIT bytes to the end of
    their last line (cut here by hand), with a note."""
    _, _, root = pair
    lines = (root / "train.txt").read_bytes()
    big = tmp_path / "big.txt"
    big.write_bytes(lines * (READ_LIMIT // len(lines) + 2))
    head = big.read_bytes()[:READ_LIMIT]
    cut = tmp_path / "cut.txt"
    cut.write_bytes(head[: head.rindex(b"\n") + 1])
    capsys.readouterr()
    assert exit_code([*heal_args(pair, tmp_path / "a"), "--text", str(big)]) == 0
    assert "only its first 4 MiB" in " ".join(capsys.readouterr().out.split())
    assert exit_code([*heal_args(pair, tmp_path / "b"), "--text", str(cut)]) == 0
    assert (tmp_path / "a" / "heal.csv").read_text() == (tmp_path / "b" / "heal.csv").read_text()


@pytest.mark.parametrize("option, value", [("--hidden-weight", "inf"), ("--hidden-weight", "nan")])
def test_non_finite_weights_are_one_line(pair, tmp_path, capsys, option, value):
    capsys.readouterr()  # inf was: "healing diverged ...; lower --lr" after the work
    assert exit_code(heal_args(pair, tmp_path / "o", option, value)) == 2
    one_line(capsys, f"{option} must be a finite number of at least 0")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------- GGUF export
@pytest.fixture(scope="module")
def bpe_model(tiny):
    """A tiny imported Llama with a byte-level BPE tokenizer, which GGUF export carries."""
    return tiny[0]


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/null"])
def test_an_out_that_is_a_device_is_refused_even_with_overwrite(bpe_model, tmp_path, capsys, kind):
    """Was: --overwrite renamed the GGUF file over /dev/full (root replaced the device)."""
    pytest.importorskip("gguf")
    out = tmp_path / "special"
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to("/dev/null")
    words = "a named pipe (FIFO)" if kind == "fifo" else "a character device"
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        args = ["export", str(bpe_model), "--format", "gguf", "--out", str(out), *extra]
        assert exit_code(args) == 2
        one_line(capsys, f"is {words}, not a regular file", "replaces only regular files")
        assert out.is_fifo() if kind == "fifo" else os.readlink(out) == "/dev/null"


def test_a_killed_exports_temporary_file_goes_with_the_next_export(bpe_model, tmp_path):
    """Was: the `.NAME.XXXX.probe-tmp` a kill -9 left (a whole model's size) stayed for good.
    A temporary that a live export holds (its flock) stays."""
    import fcntl

    pytest.importorskip("gguf")
    out = tmp_path / "m.gguf"
    dead = tmp_path / ".m.gguf.dead1234.probe-tmp"
    dead.write_bytes(b"GGUF" + bytes(1000))
    live = tmp_path / ".m.gguf.live1234.probe-tmp"
    live.write_bytes(b"GGUF")
    other = tmp_path / ".n.gguf.dead1234.probe-tmp"  # another file's: not this export's
    other.write_bytes(b"x")
    with live.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert exit_code(["export", str(bpe_model), "--format", "gguf", "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, live.name, other.name])


@pytest.mark.slow
def test_a_kill_9_mid_export_leaves_nothing_after_the_rerun(bpe_model, tmp_path):
    pytest.importorskip("gguf")
    out = tmp_path / "m.gguf"
    dying = ("import os, signal, sys, gguf\n"
             "gguf.GGUFWriter.write_tensors_to_file = lambda *a, **k: os.kill(os.getpid(), 9)\n"
             "from probe_cli.main import main\nmain(sys.argv[1:])\n")  # fmt: skip
    args = ["export", str(bpe_model), "--format", "gguf", "--out", str(out)]
    killed = subprocess.run([sys.executable, "-c", dying, *args], capture_output=True)
    assert killed.returncode == -9
    assert [p.name.endswith(".probe-tmp") for p in tmp_path.iterdir()] == [True]
    assert exit_code(args) == 0
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


@pytest.fixture
def full_disk(tmp_path):
    """A 160 kB tmpfs (root only; skipped elsewhere)."""
    where = tmp_path / "full"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(where)],
                          capture_output=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_full_disk_is_one_line(pair, bpe_model, full_disk, capsys):
    """Was: `error: OSError: 3072 requested and 24 written` and `SafetensorError: ...`, exit 1."""
    pytest.importorskip("gguf")
    capsys.readouterr()
    args = ["export", str(bpe_model), "--format", "gguf", "--out", str(full_disk / "m.gguf")]
    assert exit_code(args) == 2
    one_line(capsys, "a write failed because the disk is full")
    assert list(full_disk.iterdir()) == []  # nothing half-written
    assert exit_code(heal_args(pair, full_disk / "healed")) == 2
    one_line(capsys, "a write failed because the disk is full", "No space left on device")
    assert [p.name for p in (full_disk / "healed").iterdir()] == []  # no half state


def test_no_space_knows_each_librarys_way_of_saying_it():
    from safetensors import SafetensorError

    from probe.files import no_space

    assert "disk is full" in no_space(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert "disk is full" in no_space(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    assert no_space(SafetensorError("I/O error: No space left on device (os error 28)"))
    assert no_space(OSError("3072 requested and 24 written"))  # numpy's tofile
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("while saving") from exc
    except RuntimeError as exc:
        assert no_space(exc)  # found under what a caller wrapped it in
    assert no_space(OSError(errno.EACCES, "Permission denied")) is None
    assert no_space(ValueError("requested and")) is None


# ------------------------------------------------------------------------- the study's [heal]
def test_a_study_heal_step_never_resumes_a_state_saved_for_another_pruned_model(tmp_path):
    """Was: the resume folder was `steps/heal-METHOD-SEED` whatever the pruned model, so a step
    recomputed after [text] changed (other heads pruned, the same shapes) resumed the old
    model's weights without a word. Now the folder is named by the options and the pruned
    model, and the step's older folders lose heal's files (only those)."""
    from probe.study.heads.steps.heal import _work

    def subject(max_tokens):
        study = SimpleNamespace(text=SimpleNamespace(max_tokens=max_tokens))
        return SimpleNamespace(study=study, digest="model", workdir=tmp_path)

    options = {"method": "fisher-uniform", "seed": 0, "fraction": 0.34, "lr": 1e-3}
    first = _work(subject(16), options)
    assert first == _work(subject(16), dict(options))  # the same step: the same folder
    (first / STATE).mkdir(parents=True)
    (first / STATE / "state.json").write_text("{}")
    (first / "notes.txt").write_text("mine")
    second = _work(subject(12), options)  # [text] changed: another pruned model
    assert second != first and second.name.startswith("heal-fisher-uniform-0-")
    assert not (first / STATE).exists() and (first / "notes.txt").read_text() == "mine"
    assert _work(subject(12), {**options, "lr": 3e-3}) != second  # its own options too


def test_the_student_folder_removed_mid_run_still_ends_in_a_healed_checkpoint(
    pair, tmp_path, monkeypatch
):
    """Was: trained to the end, then `no tokenizer.json in the checkpoint` (it was read again to
    save the result), exit 2, the training lost."""
    import probe.heal.loop as loop

    student = pair[1]
    copy = tmp_path / "student"
    shutil.copytree(student, copy)
    real, calls = loop.perplexity, []

    def removing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # after the first step
            shutil.rmtree(copy)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "perplexity", removing)
    args = heal_args(pair, tmp_path / "out")
    args[1] = str(copy)
    assert exit_code(args) == 0
    healed = load_checkpoint(tmp_path / "out")
    assert healed.tokenizer().get_vocab() == load_checkpoint(student).tokenizer().get_vocab()


def test_ctrl_c_before_the_first_save_says_nothing_was_saved(pair, tmp_path, capsys, monkeypatch):
    import probe.heal.loop as loop

    def interrupted(*args, **kwargs):
        raise Interrupted()

    monkeypatch.setattr(loop, "perplexity", interrupted)
    capsys.readouterr()
    assert exit_code(heal_args(pair, tmp_path / "out")) == 130
    err = " ".join(capsys.readouterr().err.split())
    assert "healing stopped at step 0 of 4; nothing was saved yet" in err, err
    assert not (tmp_path / "out" / STATE).exists()


@pytest.mark.slow
def test_a_study_killed_in_a_heal_step_then_changed_heals_the_new_pruned_model(
    tmp_path, monkeypatch
):
    """End to end, the case above: a run interrupted after a heal step's first save, [text]
    changed (so another head is pruned), run again: its heal table is a fresh run's (it was the
    old pruned model's perplexity, 313.8 against 317.7)."""
    import pandas as pd
    from test_cli_imported import hf_dir
    from test_heal_study import heal_study_text

    import probe.heal.loop as loop

    file = tmp_path / "heal.toml"
    text = heal_study_text(hf_dir("llama", tmp_path), '["fisher-uniform"]')
    file.write_text(text.replace("seeds = 2", "seeds = 1").replace("tokens = 128", "tokens = 256"))
    real, calls = loop.perplexity, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # after the heal step's save at step 1
            raise Interrupted()
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(loop, "perplexity", interrupted)
        assert exit_code(["study", "run", str(file), "--out", str(tmp_path / "a")]) == 130
    file.write_text(file.read_text().replace("max_tokens = 16", "max_tokens = 12"))
    assert exit_code(["study", "run", str(file), "--out", str(tmp_path / "a")]) == 0
    assert exit_code(["study", "run", str(file), "--out", str(tmp_path / "b")]) == 0
    a, b = (pd.read_csv(tmp_path / x / "tables" / "heal.csv") for x in "ab")
    pd.testing.assert_frame_equal(a, b)


def test_a_fraction_that_removes_no_head_is_one_line(pair):
    """Was: a [heal] fraction of 1e-9 "healed" the unpruned model and reported "nan% won back"."""
    from probe.data.text import read_documents, text_batches
    from probe.errors import ProbeError
    from probe.heal.prune import prune_for_healing

    teacher = load_checkpoint(pair[0])
    batches = text_batches(read_documents(pair[2] / "train.txt"), teacher.tokenizer(),
                           "causal-lm", 16, 2, 1)  # fmt: skip
    for method in ("fisher+tune", "fisher-group", "fisher-uniform"):
        with pytest.raises(ProbeError, match=f"by {re.escape(method)} removes none of this"):
            prune_for_healing(teacher.model, batches, 1e-9, method)
    pruned, removed = prune_for_healing(teacher.model, batches, 0.34, "fisher-uniform")
    assert len(removed) == 4  # a third of each group of 3 query heads: 1 of 3, 2 groups x 2
    assert sum(len(s.kept_heads) for s in pruned.cfg.sites()) == 12 - 4


def test_a_heal_study_of_a_model_that_is_not_causal_is_one_line(tmp_path, capsys):
    """Was: a masked-language model was "healed" on next-token distributions, exit 0."""
    from test_cli_imported import hf_dir
    from test_heal_study import heal_study_text

    file = tmp_path / "bert.toml"
    file.write_text(heal_study_text(hf_dir("bert-mlm", tmp_path), '["fisher-uniform"]'))
    capsys.readouterr()
    assert exit_code(["study", "run", str(file), "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "[heal]: healing distills next-token distributions", "masked-lm")
    assert not (tmp_path / "out" / "steps").exists()


def test_heal_tokens_beyond_the_corpus_are_refused_before_any_step(tmp_path, capsys):
    """Was: refused only at the heal step, after every other step, naming `--tokens`."""
    from test_cli_imported import hf_dir
    from test_heal_study import heal_study_text

    from probe.data.docs import docs_corpus

    file = tmp_path / "many.toml"
    size = sum(len(d.encode()) + 1 for d in docs_corpus("train"))  # bytes: tokens at most
    text = heal_study_text(hf_dir("llama", tmp_path), '["fisher-uniform"]')
    file.write_text(text.replace("tokens = 128", f"tokens = {size + 32}"))
    capsys.readouterr()
    assert exit_code(["study", "run", str(file), "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, f"[heal] tokens = {size + 32:,} is more than the training pages")
    assert not (tmp_path / "out" / "steps").exists()
