"""Import keeps the source's dtype: bf16 and fp16 checkpoints saved by transformers (one sharded)
import in that dtype and compute what transformers computes in it; `--dtype float32` of a bf16
source is transformers' float32 of the same weights; F16/BF16/F32 GGUF files keep theirs, a
quantized one is dequantized to the dtype asked; export writes the model's dtype back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_run import exit_code
from safetensors import safe_open

from probe.checkpoint import load_checkpoint
from probe.interop.export import export_hf
from probe.interop.importer import import_model

transformers = pytest.importorskip("transformers")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny(kind: str):
    """A small random transformers model of family `kind`, biases and norms moved away from
    their initial 0 and 1 so a mis-mapped one shows."""
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=99, hidden_size=48, num_hidden_layers=2,
                                       num_attention_heads=6, num_key_value_heads=2,
                                       intermediate_size=80, tie_word_embeddings=False)  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64, tie_word_embeddings=True)  # fmt: skip
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=40, bos_token_id=0, eos_token_id=0)  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=48,
                                      max_position_embeddings=40)  # fmt: skip
        model = transformers.BertForMaskedLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def saved(kind: str, dtype: torch.dtype, where: Path, shard: str | None = None) -> Path:
    model = tiny(kind).to(dtype)
    model.save_pretrained(where, safe_serialization=True,
                          **({"max_shard_size": shard} if shard else {}))  # fmt: skip
    return where


TOKENS = torch.randint(0, 99, (3, 11), generator=torch.Generator().manual_seed(1))


def logits(model, kind: str) -> torch.Tensor:
    """probe's logits (an encoder's masked-LM logits)."""
    with torch.no_grad():
        if kind == "bert":
            return model.logits(model.features(TOKENS)).float()
        return model(TOKENS).float()


def theirs(path: Path, kind: str, dtype: torch.dtype) -> torch.Tensor:
    cls = transformers.BertForMaskedLM if kind == "bert" else transformers.AutoModelForCausalLM
    ref = cls.from_pretrained(str(path), dtype=dtype).eval()
    with torch.no_grad():
        return ref(TOKENS).logits.float()


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2", "bert"])
def test_import_keeps_the_dtype_and_computes_what_transformers_does_in_it(kind, dtype_name,
                                                                          tmp_path):  # fmt: skip
    dtype = DTYPES[dtype_name]
    shard = "20KB" if (kind, dtype_name) == ("llama", "bfloat16") else None
    path = saved(kind, dtype, tmp_path / kind, shard)
    assert (path / "model.safetensors.index.json").is_file() == (shard is not None)
    imported = import_model(path)
    assert {p.dtype for p in imported.model.parameters()} == {dtype}
    assert imported.source["dtype"] == dtype_name
    got = logits(imported.model, kind)
    want, exact = theirs(path, kind, dtype), theirs(path, kind, torch.float32)
    # Rounding to bf16/fp16 moves transformers' own logits from its float32 computation of the
    # same weights by `noise`; probe's computation in the dtype rounds as much at other places,
    # so the two may differ by the sum of two such errors, and no more.
    noise = float((want - exact).abs().max())
    assert noise > 0  # the computation did run in the lower precision
    assert float((got - want).abs().max()) <= 2 * noise
    assert float((got - exact).abs().max()) <= 2 * noise


def test_bf16_source_imported_as_float32_equals_transformers_float32(tmp_path):
    path = saved("llama", torch.bfloat16, tmp_path / "llama")
    imported = import_model(path, dtype="float32")
    assert {p.dtype for p in imported.model.parameters()} == {torch.float32}
    assert imported.source["dtype"] == "bfloat16"  # what the source holds
    exact = theirs(path, "llama", torch.float32)
    assert float((logits(imported.model, "llama") - exact).abs().max()) < 1e-4


def test_cli_import_records_the_dtype_and_converts_on_request(tmp_path, capsys):
    path = saved("qwen2", torch.bfloat16, tmp_path / "src")
    assert exit_code(["import", str(path), "--out", str(tmp_path / "kept")]) == 0
    assert "in bfloat16" in capsys.readouterr().out
    document = json.loads((tmp_path / "kept" / "config.json").read_text())
    assert document["dtype"] == "bfloat16" and document["source"]["dtype"] == "bfloat16"
    assert document["meta"]["imported"]["runtime"]["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "kept" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"}  # noqa: SIM118
    ckpt = load_checkpoint(tmp_path / "kept")
    assert {p.dtype for p in ckpt.model.parameters()} == {torch.bfloat16}
    args = ["import", str(path), "--out", str(tmp_path / "f32"), "--dtype", "float32"]
    assert exit_code(args) == 0
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"
    assert exit_code(["import", str(path), "--out", str(tmp_path / "x"), "--dtype", "f8"]) == 2
    assert "Unknown dtype 'f8'" in capsys.readouterr().err


def test_fp16_conversion_that_overflows_is_one_line(tmp_path):
    from probe.errors import ProbeError

    path = tmp_path / "big"
    model = tiny("llama")
    with torch.no_grad():
        model.model.embed_tokens.weight[0, 0] = 1e6  # beyond float16's 65504
    model.save_pretrained(path)
    with pytest.raises(ProbeError, match=r"too large for float16.*--dtype"):
        import_model(path, dtype="float16")


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert"])
def test_bf16_export_round_trip(kind, tmp_path):
    """Export writes bf16 (config and tensors), transformers loads it and computes what probe
    does within bf16 rounding, and importing the export gives back the same weights, bit for
    bit; a small shard limit writes an index transformers follows."""
    imported = import_model(saved(kind, torch.bfloat16, tmp_path / "src"))
    out = tmp_path / "hf"
    written = export_hf(imported.model, imported.source["model_type"], out, shard_bytes=20_000)
    assert (out / "model.safetensors.index.json") in written
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    for shard in out.glob("model-*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"}  # noqa: SIM118
    got = logits(imported.model, kind)
    want, exact = theirs(out, kind, torch.bfloat16), theirs(out, kind, torch.float32)
    assert float((got - want).abs().max()) <= 2 * float((want - exact).abs().max())
    again = import_model(out).model.state_dict()
    for name, tensor in imported.model.state_dict().items():
        assert again[name].dtype == torch.bfloat16 and torch.equal(again[name], tensor), name


# ---------------------------------------------------------------- GGUF files of every kind

gguf = pytest.importorskip("gguf")

from test_import_bad_gguf import add, base_metadata  # noqa: E402
from test_interop_gguf import gguf_name, llama_cpp_permute, tiny_llama  # noqa: E402


def write_gguf(path: Path, kind: str) -> tuple[Path, dict]:
    """A tiny Llama GGUF (with a tokenizer) whose matrices are stored as `kind` (F32, F16, BF16
    or a quantized type) and whose norms as F32, as llama.cpp writes them."""
    weights, dims = tiny_llama(d_model=32, n_head=4, n_kv_head=2, d_ff=64)  # 32: a Q8_0 block
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in base_metadata(dims, 10).items():
        add(writer, key, value)
    qtype = gguf.GGMLQuantizationType[kind]
    for name, w in weights.items():
        if name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, dims["n_head"])
        elif name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, dims["n_kv_head"])
        if w.ndim == 1 or kind == "F32":
            writer.add_tensor(gguf_name(name), w)
        elif kind == "F16":
            writer.add_tensor(gguf_name(name), w.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, weights


@pytest.mark.parametrize("kind, dtype", [("F32", torch.float32), ("F16", torch.float16),
                                         ("BF16", torch.bfloat16)])  # fmt: skip
def test_gguf_of_a_float_type_keeps_it(kind, dtype, tmp_path):
    path, weights = write_gguf(tmp_path / f"{kind}.gguf", kind)
    imported = import_model(path)
    state = imported.model.state_dict()
    assert imported.source["dtype"] == str(dtype).removeprefix("torch.")
    assert {p.dtype for p in imported.model.parameters()} == {dtype}
    places = {"model.layers.1.self_attn.k_proj.weight": "blocks.1.attn.k.weight",
              "model.embed_tokens.weight": "embed.weight",
              "model.layers.0.mlp.down_proj.weight": "blocks.0.ffn.down.weight",
              "model.norm.weight": "ln_final.weight"}  # fmt: skip
    for hf_name, probe_name in places.items():
        stored = torch.from_numpy(weights[hf_name]).to(dtype)  # (F32 norms rounded to it)
        assert torch.equal(state[probe_name], stored), hf_name


def test_quantized_gguf_is_dequantized_to_the_dtype_asked(tmp_path):
    path, _ = write_gguf(tmp_path / "q8.gguf", "Q8_0")
    name = "model.layers.0.mlp.up_proj.weight"
    raw = next(t for t in gguf.GGUFReader(path).tensors if t.name == gguf_name(name))
    values = torch.from_numpy(gguf.quants.dequantize(raw.data, raw.tensor_type).copy())
    default = import_model(path)
    assert default.source["dtype"] == "Q8_0"
    assert torch.equal(default.model.state_dict()["blocks.0.ffn.up.weight"], values)
    halved = import_model(path, dtype="bfloat16")
    assert {p.dtype for p in halved.model.parameters()} == {torch.bfloat16}
    got = halved.model.state_dict()["blocks.0.ffn.up.weight"]
    assert torch.equal(got, values.to(torch.bfloat16))


def test_an_integer_gguf_tensor_is_refused_by_name(tmp_path):
    from probe.errors import ProbeError

    weights, dims = tiny_llama()
    name = "model.layers.0.mlp.up_proj.weight"
    writer = gguf.GGUFWriter(tmp_path / "ints.gguf", "llama")
    for key, value in base_metadata(dims, 10).items():
        add(writer, key, value)
    for hf_name, w in weights.items():
        writer.add_tensor(gguf_name(hf_name), (10 * w).astype(np.int32) if hf_name == name else w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ProbeError, match=f"tensor '{name}' holds int32 values"):
        import_model(tmp_path / "ints.gguf")


def test_the_memory_refusal_counts_the_bytes_of_the_dtype_imported(tmp_path):
    """A vocabulary of 10**12 is refused before anything is allocated, at 2 bytes a weight in
    the source's bf16 and 4 when float32 is asked for."""
    import re

    from probe.errors import ProbeError

    path = saved("llama", torch.bfloat16, tmp_path / "huge")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": 10**12}))
    needs = {}
    for dtype in ("bfloat16", "float32"):
        with pytest.raises(ProbeError, match="of memory") as refused:
            import_model(path, dtype=None if dtype == "bfloat16" else dtype)
        amount, unit = re.search(r"need about ([\d,.]+) (\w+)", str(refused.value)).groups()
        needs[dtype] = float(amount.replace(",", "")) * {"GiB": 1, "TiB": 2**10, "PiB": 2**20}[unit]
    assert needs["float32"] == pytest.approx(2 * needs["bfloat16"], rel=1e-3)
