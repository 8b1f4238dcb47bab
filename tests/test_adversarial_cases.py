"""Classes an adversarial run still found after issue 21's fixes, each one line and exit code 2:
inputs that are not regular files (a named pipe blocked `probe import` forever, /dev/zero as
config.json ran the machine out of memory, a tokenizer.json that is a folder was skipped without
a word), safetensors headers that lie (the message quoted the library's "Error while
deserializing header"), and settings that change the function computed but were not read (a GGUF
rotary scaling factor or expert count, a BERT type_vocab_size of 0 beside token type weights)."""

from __future__ import annotations

import json
import os
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_import_bad_input
from cli_run import exit_code
from test_import_bad_input import refused, run, variant

bases = test_import_bad_input.bases  # the fixture: tiny checkpoints saved by transformers

gguf = pytest.importorskip("gguf")


@contextmanager
def within(seconds: float):
    """Fail (instead of hanging the test run) when the body blocks, e.g. opening a FIFO."""

    def timeout(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: it blocks on its input")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def make_special(path: Path, kind: str) -> None:
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "loop":
        path.symlink_to(path)
    else:
        path.mkdir()


# (file of the model directory, what it is made, words of the message)
SPECIAL = [
    ("config.json", "fifo", "is a named pipe (FIFO), not a regular file"),
    ("config.json", "device", "is a character device, not a regular file"),
    ("model.safetensors", "fifo", "should be a safetensors weights file"),
    ("model.safetensors", "device", "is a character device"),
    ("model.safetensors", "loop", "Too many levels of symbolic links"),
    ("tokenizer.json", "fifo", "should be the model's tokenizer.json"),
    ("tokenizer.json", "folder", "tokenizer.json is a directory"),
]


@pytest.mark.parametrize("file,kind,words", SPECIAL, ids=[f"{f}-{k}" for f, k, _ in SPECIAL])
def test_an_input_that_is_not_a_regular_file_is_one_line(file, kind, words, bases, tmp_path,
                                                         capsys):  # fmt: skip
    source = variant(bases["gpt2"], tmp_path / "src")
    (source / "tokenizer.json").write_text("{}")  # replaced below when it is the case
    make_special(source / file, kind)
    with within(20):
        message = refused(source, tmp_path / "out", capsys)
    assert str(source / file) in message and words in message, message


def test_shard_index_that_is_a_fifo_is_one_line(bases, tmp_path, capsys):
    source = variant(bases["gpt2"], tmp_path / "src")
    (source / "model.safetensors").unlink()
    make_special(source / "model.safetensors.index.json", "fifo")
    with within(20):
        message = refused(source, tmp_path / "out", capsys)
    assert "index.json is a named pipe" in message, message


@pytest.mark.parametrize("file", ["config.json", "model.safetensors"])
def test_checkpoint_files_that_are_fifos_are_one_line(file, bases, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert exit_code(["import", str(bases["gpt2"]), "--out", str(ckpt)]) == 0
    make_special(ckpt / file, "fifo")
    with within(20):
        code, err = run(["info", str(ckpt)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{ckpt / file} is a named pipe" in " ".join(err.split()), err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_text_and_study_files_that_are_not_regular_files_are_one_line(kind, bases, tmp_path,
                                                                      capsys):  # fmt: skip
    ckpt = tmp_path / "ckpt"
    assert exit_code(["import", str(bases["gpt2"]), "--out", str(ckpt)]) == 0
    text, study = tmp_path / "t.txt", tmp_path / "s.toml"
    make_special(text, kind)
    make_special(study, kind)
    for args in (["eval", str(ckpt), "--text", str(text), "--out", str(tmp_path / "o")],
                 ["study", "validate", str(study)]):  # fmt: skip
        with within(20):
            code, err = run(args, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "not a regular file" in err, err


def lying_header(path: Path, how: str) -> None:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    names = [k for k in header if k != "__metadata__"]
    if how == "empty":
        path.write_bytes(b"")
        return
    if how == "too-long":
        path.write_bytes(struct.pack("<Q", 10**8) + raw[8:])
        return
    if how == "overlap":
        header[names[1]]["data_offsets"] = header[names[0]]["data_offsets"]
    elif how == "past-end":
        header[names[0]]["data_offsets"] = [len(data), len(data) + 10**6]
    elif how == "dtype":
        header[names[0]]["dtype"] = "XYZ"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("how", ["empty", "too-long", "overlap", "past-end", "dtype"])
def test_a_safetensors_header_that_lies_is_one_line_in_words(how, bases, tmp_path, capsys):
    source = variant(bases["gpt2"], tmp_path / "src")
    lying_header(source / "model.safetensors", how)
    message = refused(source, tmp_path / "out", capsys)
    assert f"{source / 'model.safetensors'} is not a readable safetensors file" in message
    assert "Error" not in message, message  # the library's "Error while deserializing header"


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("llama.expert_count", 4, "mixture-of-experts layers"),
    ],
)
def test_gguf_metadata_that_changes_the_function_is_refused(key, value, words, tmp_path, capsys):
    from test_import_bad_gguf import write_gguf

    path = write_gguf(tmp_path / "m.gguf", {key: value})
    message = refused(path, tmp_path / "out", capsys)
    assert f"metadata: {key} = {value!r}: {words} is not implemented" in message, message


@pytest.mark.parametrize("key", ["llama.rope.scaling.factor", "llama.rope.scale_linear"])
def test_gguf_scaling_factor_without_a_type_is_linear_as_llama_cpp_reads_it(key, tmp_path):
    """llama.cpp's loader takes a factor without `rope.scaling.type` (and the older
    `rope.scale_linear`) as linear scaling; probe imports it so, never drops it."""
    from test_import_bad_gguf import write_gguf

    from probe.checkpoint import load_checkpoint
    from probe.rope import RopeScaling

    path = write_gguf(tmp_path / "m.gguf", {key: 4.0})
    assert exit_code(["import", str(path), "--out", str(tmp_path / "out")]) == 0
    cfg = load_checkpoint(tmp_path / "out", read_weights=False).model_cfg
    assert cfg.rope_scaling == RopeScaling("linear", 4.0)


def test_gguf_neutral_scaling_factor_still_imports(tmp_path, capsys):
    from test_import_bad_gguf import write_gguf

    path = write_gguf(tmp_path / "m.gguf", {"llama.rope.scaling.factor": 1.0})
    assert exit_code(["import", str(path), "--out", str(tmp_path / "out")]) == 0


def test_bert_type_vocab_size_0_beside_token_type_weights_is_refused(bases, tmp_path, capsys):
    source = variant(bases["bert"], tmp_path / "src", type_vocab_size=0)
    message = refused(source, tmp_path / "out", capsys)
    assert "type_vocab_size 0, but the weights hold token type embeddings of shape [2, 16]" in (
        message
    ), message


def test_a_huge_length_range_is_refused_before_it_is_built():
    from probe.data.tasks import parse_lengths
    from probe.errors import ProbeError

    with within(20), pytest.raises(ProbeError, match="names 1,000,000,000 lengths; at most"):
        parse_lengths("1:1000000000")
    assert parse_lengths("1:4096")[-1] == 4096  # 4,096 lengths are fine


def test_nan_ffn_mult_is_one_line(tmp_path, capsys):
    code, err = run(["train", "--steps", "1", "--ffn-mult", "nan", "--out", str(tmp_path)], capsys)
    assert code == 2 and err.strip() == "error: ffn_mult must be a positive finite number, got nan."


def test_a_huge_induction_period_is_refused_with_the_memory_it_needs(bases, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert exit_code(["import", str(bases["gpt2"]), "--out", str(ckpt)]) == 0
    args = ["inspect", str(ckpt), "--lengths", "8", "--batch-size", "2", "--batches", "1",
            "--period", str(10**9), "--out", str(tmp_path / "o")]  # fmt: skip
    code, err = run(args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "2,000,000,000 tokens would need about" in err and "--period" in err, err
