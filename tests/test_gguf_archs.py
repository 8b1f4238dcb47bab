"""read_gguf for the architectures beyond Llama, against transformers itself.

Each test builds a tiny random transformers model, writes it as GGUF the way llama.cpp's
convert_hf_to_gguf.py does for that architecture (written here from the converter, with the
`gguf` package's own HF -> GGUF name table: Gemma's norms + 1, GPT-NeoX's qkv regrouped, lm_head
dropped for Gemma, the metadata keys each converter class writes), reads it back with read_gguf
and checks that (1) every tensor equals the checkpoint transformers saved (name, shape, values)
and (2) transformers, given only the config dict read_gguf built and those tensors, computes the
original model's logits on a sequence longer than every sliding window.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch as safetensors_torch
import torch

from probe.errors import ProbeError

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from probe.interop.gguf import read_gguf  # noqa: E402
from probe.interop.tokenizer import tokenizer_from_gguf  # noqa: E402

SEQ = 12  # longer than every sliding window below (4)
SIZES = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_attention_heads=4)


def _configs() -> dict[str, tuple[str, object]]:
    """llama.cpp architecture -> (the gguf package's MODEL_ARCH name, a tiny HF config)."""
    t = transformers
    gemma = dict(SIZES, num_key_value_heads=2, head_dim=16)
    return {
        "qwen3": ("QWEN3", t.Qwen3Config(**gemma, num_hidden_layers=2, rope_theta=1e6,
                                          rms_norm_eps=1e-6, tie_word_embeddings=False)),
        "gemma": ("GEMMA", t.GemmaConfig(**gemma, num_hidden_layers=2)),
        "gemma2": ("GEMMA2", t.Gemma2Config(**gemma, num_hidden_layers=3, sliding_window=4,
                                            query_pre_attn_scalar=16, attn_logit_softcapping=3.0,
                                            final_logit_softcapping=2.0)),
        "gemma3": ("GEMMA3", t.Gemma3TextConfig(**gemma, num_hidden_layers=6, sliding_window=4,
                                                query_pre_attn_scalar=16,
                                                final_logit_softcapping=2.5)),
        "phi3": ("PHI3", t.Phi3Config(**SIZES, num_key_value_heads=2, num_hidden_layers=2,
                                      sliding_window=4, partial_rotary_factor=0.5,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "olmo2": ("OLMO2", t.Olmo2Config(**SIZES, num_key_value_heads=2, num_hidden_layers=2,
                                         pad_token_id=0, eos_token_id=2)),
        "gptneox": ("GPTNEOX", t.GPTNeoXConfig(**SIZES, num_hidden_layers=2, rotary_pct=0.5,
                                               use_parallel_residual=True)),
    }  # fmt: skip


def tiny_checkpoint(arch: str, tmp_path: Path, seed: int = 0):
    """A random model of `arch` saved by transformers; (model, its config.json, its tensors)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_configs()[arch][1]).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # multiples of 1/64 in [-0.5, 0.5]: (w + 1) - 1 == w in float32
                p.copy_(torch.randint(-32, 33, p.shape, generator=gen) / 64)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    out = tmp_path / f"hf-{arch}"
    model.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    return model, config, safetensors_torch.load_file(out / "model.safetensors")


def _tokenizer_metadata(w, arch: str, vocab: int) -> None:
    if arch in ("gemma", "gemma2", "phi3"):  # SentencePiece (`_set_vocab_sentencepiece`)
        pieces = ["<pad>", "<eos>", "<bos>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(pieces + [f"<t{i}>" for i in range(vocab - len(pieces))])
        w.add_token_scores([0.0] * 3 + [-float(i) for i in range(vocab - 3)])
        w.add_token_types([3] * 3 + [1] * (vocab - 3))
        if arch != "phi3":  # GemmaModel.set_vocab: Gemma's text has no dummy prefix
            w.add_add_space_prefix(False)
        return
    pieces = [*"abcdefghijklmnopqrstuvwxyz", "Ġ", "ab", "Ġa"]  # byte-level BPE (`_set_vocab_gpt2`)
    tokens = pieces + [f"<|extra{i}|>" for i in range(vocab - len(pieces))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre({"qwen3": "qwen2", "gptneox": "gpt-2"}.get(arch, "dbrx"))
    w.add_token_list(tokens)
    w.add_token_types([1] * len(pieces) + [3] * (vocab - len(pieces)))
    w.add_token_merges(["a b", "Ġ a"])


def write_like_llama_cpp(path: Path, arch: str, hf: dict, tensors: dict) -> Path:
    """`tensors` (HF names) and `hf` (config.json) as convert_hf_to_gguf.py writes them."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_configs()[arch][0]], hf["num_hidden_layers"])
    w = gguf.GGUFWriter(path, arch)
    d, n_head = hf["hidden_size"], hf["num_attention_heads"]
    w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_block_count(hf["num_hidden_layers"])
    w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(n_head)
    rope = hf["rope_parameters"]
    if arch == "gptneox":  # GPTNeoXModel.set_gguf_parameters: no kv heads, no rope base
        w.add_rope_dimension_count(int(rope["partial_rotary_factor"] * (d // n_head)))
        w.add_parallel_residual(hf["use_parallel_residual"])
        w.add_layer_norm_eps(hf["layer_norm_eps"])
    else:
        w.add_head_count_kv(hf["num_key_value_heads"])
        w.add_layer_norm_rms_eps(hf["rms_norm_eps"])
        w.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
        if "head_dim" in hf:
            w.add_key_length(hf["head_dim"])
            w.add_value_length(hf["head_dim"])
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(hf["original_max_position_embeddings"])
        w.add_rope_dimension_count(int(rope["partial_rotary_factor"] * d) // n_head)
        w.add_sliding_window(hf["sliding_window"] or 0)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(hf["attn_logit_softcapping"])
        w.add_final_logit_softcapping(hf["final_logit_softcapping"])
        w.add_sliding_window(hf["sliding_window"])
    if arch == "gemma3":
        if hf["final_logit_softcapping"]:
            w.add_final_logit_softcapping(hf["final_logit_softcapping"])
        w.add_sliding_window(hf["sliding_window"])
    _tokenizer_metadata(w, arch, hf["vocab_size"])
    for token, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                       ("pad", w.add_pad_token_id)):  # fmt: skip
        if hf.get(f"{token}_token_id") is not None:  # gguf.SpecialVocab: the config's ids
            add(hf[f"{token}_token_id"])
    for name, t in tensors.items():
        if name == "lm_head.weight" and arch in ("gemma", "gemma2"):
            continue  # GemmaModel / Gemma2Model skip it
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1  # Gemma's RMSNorm multiplies by (1 + w); llama.cpp by the stored weight
        if arch == "gptneox" and "query_key_value" in name:  # [head, 3, d_head] -> [3, head, ...]
            t = torch.cat([part.reshape(-1, *t.shape[1:]) for part in
                           t.reshape(n_head, 3, d // n_head, *t.shape[1:]).unbind(1)])  # fmt: skip
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", list(_configs()))
def test_tensors_and_config_are_the_checkpoint_transformers_saved(arch, tmp_path):
    model, hf, saved = tiny_checkpoint(arch, tmp_path)
    read = read_gguf(write_like_llama_cpp(tmp_path / f"{arch}.gguf", arch, hf, saved))
    assert set(read.tensors) == set(saved)
    for name, expected in saved.items():
        assert read.tensors.shapes[name] == tuple(expected.shape), name
        assert torch.equal(read.tensors[name], expected), name
    config = read.config
    for key, value in config.items():  # every key read_gguf sets is the one transformers saved
        if key in hf and key not in ("architectures",):
            assert value == hf[key], key
    assert config["architectures"] == hf["architectures"]

    # transformers, from read_gguf's config dict and tensors alone, computes the same logits
    out = tmp_path / "from-gguf"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    weights = {name: read.tensors[name] for name in read.tensors}
    safetensors_torch.save_file(weights, out / "model.safetensors")
    rebuilt = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, hf["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


def test_gemma2_27b_scales_queries_by_the_model_width(tmp_path):
    """llama.cpp's rule: 1/sqrt(d_model / n_head) when the layer count is the 27B's (46)."""
    _, hf, saved = tiny_checkpoint("gemma2", tmp_path)
    hf = {**hf, "num_hidden_layers": 46}
    saved = dict(saved)
    for i in range(3, 46):
        for name in [n for n in saved if n.startswith("model.layers.0.")]:
            saved[name.replace("layers.0.", f"layers.{i}.")] = saved[name]
    config = read_gguf(write_like_llama_cpp(tmp_path / "g.gguf", "gemma2", hf, saved)).config
    assert config["query_pre_attn_scalar"] == 32 // 4 != config["head_dim"]


def test_gguf_tokenizers_of_the_byte_level_architectures(tmp_path):
    for arch in ("qwen3", "gptneox", "olmo2"):
        _, hf, saved = tiny_checkpoint(arch, tmp_path / arch)
        read = read_gguf(write_like_llama_cpp(tmp_path / f"{arch}.gguf", arch, hf, saved))
        tok = tokenizer_from_gguf(read.metadata, tmp_path / f"{arch}.gguf")
        assert tok.encode("ab a").tokens == ["ab", "Ġa"], arch


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "phi3"])
def test_gguf_tokenizers_of_the_sentencepiece_architectures(arch, tmp_path):
    """BOS from the config's id first; Phi-3 prefixes a space to the text, Gemma does not."""
    _, hf, saved = tiny_checkpoint(arch, tmp_path)
    read = read_gguf(write_like_llama_cpp(tmp_path / f"{arch}.gguf", arch, hf, saved))
    tok = tokenizer_from_gguf(read.metadata, tmp_path / f"{arch}.gguf")
    words = ["\u2581ab", "\u2581a"] if arch == "phi3" else ["ab", "\u2581a"]
    assert tok.encode("ab a").ids == [hf["bos_token_id"], *map(tok.token_to_id, words)]
    assert tok.decode(tok.encode("ab a").ids) == "ab a"


def _rewrite(path: Path, arch: str, extra_kv: dict, extra_tensors: dict | None = None) -> Path:
    """A copy of the file at `path` with metadata keys set (or added) and tensors added."""
    reader = gguf.GGUFReader(path)
    out = path.with_name("changed.gguf")
    w = gguf.GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in extra_kv:
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, kind, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, kind)
    for key, (value, kind) in extra_kv.items():
        w.add_key_value(key, value, kind)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    for name, value in (extra_tensors or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


U32, F32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
REFUSALS = [
    ("phi3", {}, {"rope_factors_long.weight": np.ones(2, np.float32)}, "lacks the tensor "
     "'rope_factors_short.weight' \\(longrope needs both"),
    ("gemma3", {"gemma3.rope.scaling.type": ("longrope", STR),
                "gemma3.rope.scaling.factor": (8.0, F32)}, {}, "probe reads rotary scaling "
     "'linear' and 'yarn' from metadata"),
    ("qwen3", {}, {"rope_freqs.weight": np.ones(8, np.float32)}, "probe reads for llama "
     "\\(rope_freqs, llama3 scaling\\) and phi3 .*, not for Qwen3"),
    ("olmo2", {"olmo2.attention.sliding_window": (4, U32)}, {}, "sliding-window layers"),
    ("qwen3", {"qwen3.expert_count": (8, U32)}, {}, "mixture-of-experts layers"),
    ("gptneox", {}, {"blk.0.attn_q.weight": np.ones((32, 32), np.float32)}, "no place in a "
     "Hugging Face GPT-NeoX"),
]  # fmt: skip


@pytest.mark.parametrize("arch, kv, tensors, message", REFUSALS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSALS)])  # fmt: skip
def test_what_probe_cannot_compute_is_one_line(arch, kv, tensors, message, tmp_path):
    _, hf, saved = tiny_checkpoint(arch, tmp_path)
    path = write_like_llama_cpp(tmp_path / f"{arch}.gguf", arch, hf, saved)
    with pytest.raises(ProbeError, match=message) as e:
        read_gguf(_rewrite(path, arch, kv, tensors))
    assert "\n" not in str(e.value) and "changed.gguf" in str(e.value)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    _, hf, saved = tiny_checkpoint("olmo2", tmp_path)
    path = write_like_llama_cpp(tmp_path / "m.gguf", "olmo2", hf, saved)
    with pytest.raises(ProbeError) as e:
        read_gguf(_rewrite(path, "mamba", {}))
    assert str(e.value).endswith(
        "architecture 'mamba' is not supported; supported: llama, qwen3, gemma, gemma2, gemma3, "
        "phi3, olmo2, gptneox"
    )
