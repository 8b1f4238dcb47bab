"""`import_model` and `probe import` of GGUF files of the newer architectures, end to end: the
probe model built from a GGUF file computes the logits transformers computes on the original
checkpoint (float32, within 1e-4). The files are written as llama.cpp's converter writes them
(`test_gguf_archs.write_like_llama_cpp`). An architecture whose family module probe does not hold
yet is skipped, naming it. Every file carries its tokenizer: byte-level BPE, or SentencePiece for
Gemma, Gemma 2 and Phi-3 (`tokenizer.ggml.model == "llama"`), whose BOS the config names."""

from __future__ import annotations

import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from test_gguf_archs import _configs, tiny_checkpoint, write_like_llama_cpp

from probe.interop.families import supported
from probe.interop.gguf import read_gguf
from probe.interop.importer import import_model

SENTENCEPIECE = ("gemma", "gemma2", "phi3")  # tokenizer.ggml.model 'llama'
TOL = 1e-4


def _gguf(arch: str, tmp_path):
    model, hf, saved = tiny_checkpoint(arch, tmp_path)
    path = write_like_llama_cpp(tmp_path / f"{arch}.gguf", arch, hf, saved)
    assert read_gguf(path).config["model_type"] in supported()
    return model, hf, path


@pytest.mark.parametrize("arch", list(_configs()))
def test_imported_gguf_computes_the_original_logits(arch, tmp_path):
    model, hf, path = _gguf(arch, tmp_path)
    imported = import_model(path)
    assert imported.source["format"] == "gguf"
    assert imported.source["model_type"] == hf["model_type"]
    assert imported.tokenizer is not None
    if arch in SENTENCEPIECE:  # BOS first, as llama.cpp adds it to a SentencePiece vocabulary
        assert imported.tokenizer.encode("ab").ids[0] == hf["bos_token_id"]
    tokens = torch.randint(0, hf["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(tokens).logits
        got = imported.model(tokens)
    assert (got - want).abs().max() < TOL


def test_probe_import_of_a_qwen3_gguf(tmp_path):
    model, hf, path = _gguf("qwen3", tmp_path)
    out = tmp_path / "ckpt"
    assert exit_code(["import", str(path), "--out", str(out)]) == 0
    assert exit_code(["info", str(out)]) == 0
    loaded = load_checkpoint(out)
    assert loaded.source["format"] == "gguf"
    probe_model = loaded.model
    tokens = torch.randint(0, hf["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (probe_model(tokens) - model(tokens).logits).abs().max() < TOL
    assert exit_code(["import", str(path), "--out", str(out)]) == 2  # nothing overwritten


@pytest.mark.parametrize("arch", SENTENCEPIECE)
def test_probe_import_carries_a_sentencepiece_tokenizer(arch, tmp_path):
    """`probe import` of a Gemma, Gemma 2 or Phi-3 GGUF saves the tokenizer the file describes;
    the saved checkpoint's tokenizer encodes as the file's does (BOS, the words)."""
    _, hf, path = _gguf(arch, tmp_path)
    out = tmp_path / "ckpt"
    assert exit_code(["import", str(path), "--out", str(out)]) == 0
    tok = load_checkpoint(out).tokenizer()
    words = ["\u2581ab", "\u2581a"] if arch == "phi3" else ["ab", "\u2581a"]
    assert tok.encode("ab a").ids == [hf["bos_token_id"], *map(tok.token_to_id, words)]
