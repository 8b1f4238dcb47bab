"""`probe import` of a GGUF file with bad metadata: exit code 2 and one line naming the file, the
metadata key and what was expected. Each case is a valid tiny Llama written with gguf's
GGUFWriter (q/k rows in llama.cpp's layout), with one metadata value changed or removed."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import exit_code

gguf = pytest.importorskip("gguf")

from test_interop_gguf import gguf_name, llama_cpp_permute, tiny_llama  # noqa: E402

DELETE = object()
TOKENS = [*"abcdefghi", "ab"]  # the merge "a b" makes "ab"


def base_metadata(dims: dict, vocab: int) -> dict:
    return {
        "llama.block_count": dims["n_layer"],
        "llama.context_length": 32,
        "llama.embedding_length": dims["d_model"],
        "llama.feed_forward_length": dims["d_ff"],
        "llama.attention.head_count": dims["n_head"],
        "llama.attention.head_count_kv": dims["n_kv_head"],
        "llama.attention.layer_norm_rms_epsilon": 1e-6,
        "llama.rope.freq_base": 500000.0,
        "llama.vocab_size": vocab,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 3,
    }


def add(writer, key: str, value) -> None:
    """`value` under `key` with the GGUF type its Python type asks for."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, value)


def write_gguf(path: Path, changes: dict) -> Path:
    weights, dims = tiny_llama()
    metadata = base_metadata(dims, weights["model.embed_tokens.weight"].shape[0])
    for key, value in changes.items():
        if value is DELETE:
            metadata.pop(key)
        else:
            metadata[key] = value
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in metadata.items():
        add(writer, key, value)
    for name, w in weights.items():
        if name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, dims["n_head"])
        elif name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, dims["n_kv_head"])
        writer.add_tensor(gguf_name(name), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


CASES = [
    ({"llama.embedding_length": "8"}, "metadata: llama.embedding_length must be a positive "
     "integer, got '8' (str)"),
    ({"llama.embedding_length": [8, 8]}, "llama.embedding_length must be a positive integer, got "
     "[8, 8] (list)"),
    ({"llama.embedding_length": 8.0}, "llama.embedding_length must be a positive integer, got 8.0"),
    ({"llama.embedding_length": DELETE}, "metadata has no 'llama.embedding_length'"),
    ({"llama.attention.head_count": 0}, "llama.attention.head_count must be a positive integer, "
     "got 0"),
    ({"llama.attention.head_count_kv": 0}, "llama.attention.head_count_kv must be a positive "
     "integer, got 0"),
    ({"llama.attention.head_count_kv": [1, 1]}, "llama.attention.head_count_kv must be a "
     "positive integer"),
    ({"llama.attention.head_count": 3}, "llama.embedding_length (8) must be a multiple of "
     "llama.attention.head_count (3)"),
    ({"llama.attention.head_count": 4, "llama.attention.head_count_kv": 3},
     "llama.attention.head_count (4) must be a multiple of llama.attention.head_count_kv (3)"),
    ({"llama.block_count": -2}, "llama.block_count must be a positive integer"),
    ({"llama.block_count": True}, "llama.block_count must be a positive integer, got True"),
    ({"llama.feed_forward_length": [12, 12]}, "llama.feed_forward_length must be a positive "
     "integer"),
    ({"llama.context_length": "32"}, "llama.context_length must be a positive integer"),
    ({"llama.vocab_size": 10**9 * 4}, "tensor 'token_embd.weight' has shape (10, 8), expected "
     "(4000000000, 8) from the metadata"),
    ({"llama.attention.layer_norm_rms_epsilon": "tiny"}, "layer_norm_rms_epsilon must be a "
     "positive number, got 'tiny'"),
    ({"llama.attention.layer_norm_rms_epsilon": 0.0}, "layer_norm_rms_epsilon must be a "
     "positive number, got 0.0"),
    ({"llama.rope.freq_base": "big"}, "llama.rope.freq_base must be a positive number"),
    ({"llama.rope.freq_base": 0.5}, "llama.rope.freq_base must be a number greater than 1"),
    ({"llama.rope.scaling.type": "yarn"}, "llama.rope.scaling.type = 'yarn'"),
    ({"llama.rope.scaling.type": 2}, "llama.rope.scaling.type must be a string"),
    ({"tokenizer.ggml.bos_token_id": "3"}, "tokenizer.ggml.bos_token_id must be an integer of "
     "at least 0"),
    ({"tokenizer.ggml.tokens": [*TOKENS, "x", "y"]}, "the tokenizer makes token ids up to 11 "
     "(12 tokens) but the model's vocabulary holds 10"),
    ({"tokenizer.ggml.merges": ["a c"]}, "GGUF merge 'a c' needs the token 'ac', which is not in "
     "the vocabulary"),
    # the tokenizer's keys are read through the same typed reader: the file and the key named
    ({"tokenizer.ggml.model": 7}, "metadata: tokenizer.ggml.model must be a string, got 7 (int)"),
    ({"tokenizer.ggml.model": "bert"}, "metadata: tokenizer.ggml.model 'bert' is not "
     "supported; supported: gpt2 (byte-level BPE), llama (SentencePiece)"),
    ({"tokenizer.ggml.pre": DELETE}, "metadata has no 'tokenizer.ggml.pre'"),
    ({"tokenizer.ggml.pre": "mystery"}, "metadata: tokenizer.ggml.pre 'mystery' is not "
     "supported"),
    ({"tokenizer.ggml.tokens": "abc"}, "metadata: tokenizer.ggml.tokens must be a list of "
     "strings, got 'abc' (str)"),
    ({"tokenizer.ggml.tokens": list(range(10))}, "metadata: tokenizer.ggml.tokens must be a list "
     "of strings"),
    ({"tokenizer.ggml.merges": "a b"}, "metadata: tokenizer.ggml.merges must be a list of "
     "strings, got 'a b' (str)"),
    ({"tokenizer.ggml.merges": ["ab"]}, "metadata: tokenizer.ggml.merges: GGUF merge 'ab' is not "
     "two tokens"),
    ({"tokenizer.ggml.token_type": [1, 1, 1]}, "metadata: tokenizer.ggml.token_type lists 3 token "
     "types but tokenizer.ggml.tokens 10 tokens"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "metadata: tokenizer.ggml.add_bos_token must be "
     "true or false, got 'yes'"),
    ({"tokenizer.ggml.add_eos_token": True}, "metadata has no 'tokenizer.ggml.eos_token_id'"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[next(iter(c[0])) for c in CASES])
def test_bad_gguf_metadata_is_one_line(case, tmp_path, capsys):
    changes, words = case
    path = write_gguf(tmp_path / "m.gguf", changes)
    capsys.readouterr()
    code = exit_code(["import", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and "--debug" not in err, err
    message = " ".join(err.split())
    assert words in message, message
    assert str(path) in message  # the file is named
    assert not (tmp_path / "out").exists()


def test_the_unchanged_file_imports(tmp_path, capsys):
    path = write_gguf(tmp_path / "m.gguf", {})
    assert exit_code(["import", str(path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()  # every case above mutates a good file


def test_token_types_that_are_not_integers_are_one_line(tmp_path, capsys):
    path = write_gguf(tmp_path / "m.gguf", {"tokenizer.ggml.token_type": ["x"] * len(TOKENS)})
    capsys.readouterr()
    assert exit_code(["import", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"GGUF file '{path}': metadata: tokenizer.ggml.token_type must be a list of " in err
