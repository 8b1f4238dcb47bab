"""Rotary scaling through GGUF files, against transformers and llama.cpp.

Import: tiny Llama files written here by hand the way llama.cpp's converter writes them
(LlamaModel.generate_extra_tensors' `rope_freqs.weight` loop for llama3, TextModel.
set_gguf_parameters' `rope.scaling.*` keys for linear and yarn, Phi3MiniModel's
`rope_factors_long/short` and `attn_factor` for longrope) are read by probe to the section the
Hugging Face config has, and probe's logits are transformers' own for that config past the
original context. Export: a scaled Llama written by probe's exporter reads back to the same
section and logits, and its `rope_freqs.weight` divides llama.cpp's base frequencies into
transformers' llama3 frequencies. In a slow test, llama.cpp itself runs the exported files.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from probe.errors import ProbeError

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from test_gguf_archs import _rewrite, _tokenizer_metadata  # noqa: E402
from test_gguf_export import NO_LLAMA_CPP, VOCAB, bpe_tokenizer  # noqa: E402

from probe.interop.gguf import read_gguf  # noqa: E402
from probe.interop.gguf_write import export_gguf  # noqa: E402
from probe.interop.importer import import_model  # noqa: E402

ORIGINAL = 64  # the original context of every scaled section: the tests run past it
LENGTH = 80
BASE = 10000.0
SECTIONS = {  # Hugging Face rope_parameters, without rope_theta
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
             "beta_fast": 16.0, "beta_slow": 2.0},
}  # fmt: skip


def hf_llama(section: dict, tmp_path, vocab: int = 40, seed: int = 0):
    """A tiny random transformers Llama (heads of 16: 8 rotary pairs, some in llama3's smooth
    band at L = 64) with `section`, saved; (model, its directory)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters={**section, "rope_theta": BASE}, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    out = tmp_path / "hf"
    model.save_pretrained(out)
    return model, out


def converter_rope_freqs(section: dict, dim: int) -> np.ndarray:
    """llama.cpp's LlamaModel.generate_extra_tensors, as written there (a loop over pairs)."""
    freqs = 1.0 / (BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = section["factor"], section["low_freq_factor"], section["high_freq_factor"]
    old_context_len = section["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


def write_llama_like_converter(path, model, section: dict):
    """`model` (transformers Llama) as convert_hf_to_gguf.py writes it: metadata, q/k rows in
    adjacent rotary pairs, the rotary scaling's keys or rope_freqs tensor."""
    hf = model.config
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(hf.num_hidden_layers)
    w.add_context_length(hf.max_position_embeddings)
    w.add_embedding_length(hf.hidden_size)
    w.add_feed_forward_length(hf.intermediate_size)
    w.add_head_count(hf.num_attention_heads)
    w.add_head_count_kv(hf.num_key_value_heads)
    w.add_rope_freq_base(BASE)
    w.add_layer_norm_rms_eps(hf.rms_norm_eps)
    w.add_vocab_size(hf.vocab_size)
    d_head = hf.hidden_size // hf.num_attention_heads
    w.add_rope_dimension_count(d_head)
    kind = section["rope_type"]
    if kind in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        w.add_rope_scaling_factor(section["factor"])
    if kind == "yarn":
        w.add_rope_scaling_orig_ctx_len(section["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(section["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(section["beta_slow"])
    _tokenizer_metadata(w, "llama", hf.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, hf.num_hidden_layers)
    if kind == "llama3":
        w.add_tensor("rope_freqs.weight", converter_rope_freqs(section, d_head))
    for name, t in model.state_dict().items():
        heads = {"q_proj": hf.num_attention_heads, "k_proj": hf.num_key_value_heads}
        n_head = next((n for k, n in heads.items() if k in name), None)
        if n_head is not None:  # LlamaModel.permute
            t = t.reshape(n_head, 2, t.shape[0] // n_head // 2, *t.shape[1:])
            t = t.swapaxes(1, 2).reshape(-1, t.shape[-1])
        w.add_tensor(names.get_name(name, try_suffixes=(".weight",)), t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


@pytest.mark.parametrize("kind", list(SECTIONS))
def test_a_converter_file_reads_as_the_hugging_face_section(kind, tmp_path):
    section = SECTIONS[kind]
    model, _ = hf_llama(section, tmp_path)
    path = write_llama_like_converter(tmp_path / "m.gguf", model, section)
    config = read_gguf(path).config
    assert config["rope_parameters"] == {**section, "rope_theta": BASE}
    imported = import_model(path).model
    ids = torch.randint(0, 40, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    gap = (_logits(imported, ids) - _logits(model, ids)).abs().max().item()
    assert gap < 1e-4, gap


def test_phi3_longrope_reads_its_factor_tensors(tmp_path):
    """Phi3MiniModel: original context and attention factor as metadata, the long and short
    factors as tensors; transformers' logits within and past the original context."""
    from test_gguf_archs import write_like_llama_cpp

    pairs = 4  # heads of 16, half rotated
    long, short = [1.0, 1.5, 3.0, 6.0], [1.0, 1.25, 1.5, 2.0]
    config = transformers.Phi3Config(
        vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5,
        max_position_embeddings=128, original_max_position_embeddings=32,
        rope_parameters={"rope_type": "longrope", "long_factor": long, "short_factor": short,
                         "rope_theta": BASE, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    plain = write_like_llama_cpp(tmp_path / "p.gguf", "phi3", hf, model.state_dict())
    attn = math.sqrt(1 + math.log(128 / 32) / math.log(32))  # Phi3MiniModel's attn_factor
    path = _rewrite(plain, "phi3", {"phi3.rope.scaling.attn_factor": (attn, F32)},
                    {"rope_factors_long.weight": np.array(long, np.float32),
                     "rope_factors_short.weight": np.array(short, np.float32)})  # fmt: skip
    section = read_gguf(path).config["rope_parameters"]
    assert section == {"rope_type": "longrope", "rope_theta": BASE, "partial_rotary_factor": 0.5,
                       "long_factor": long, "short_factor": short}  # fmt: skip
    imported = import_model(path).model
    assert len(long) == pairs and imported.cfg.rope_scaling.kind == "longrope"
    for length in (24, 48):  # short factors, then long ones
        ids = torch.randint(3, 40, (1, length), generator=torch.Generator().manual_seed(length))
        gap = (_logits(imported, ids) - _logits(model, ids)).abs().max().item()
        assert gap < 1e-4, (length, gap)


def test_gemma3_scales_its_global_layers_only(tmp_path):
    """Gemma 3 (4B and up): linear scaling on the full-attention layers; llama.cpp's gemma3
    keeps the sliding layers unscaled (rope_freq_scale_train_swa = 1), as transformers does."""
    from test_gguf_archs import write_like_llama_cpp

    config = transformers.Gemma3TextConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_hidden_layers=6, sliding_window=4,
        query_pre_attn_scalar=16, max_position_embeddings=128,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": BASE}},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norms in multiples of 1/64: (w + 1) - 1 == w in float32
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randint(-32, 33, p.shape) / 64)
    model.save_pretrained(tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    plain = write_like_llama_cpp(tmp_path / "g.gguf", "gemma3", hf, model.state_dict())
    path = _rewrite(plain, "gemma3", {"gemma3.rope.scaling.type": ("linear", STR),
                                      "gemma3.rope.scaling.factor": (8.0, F32)})  # fmt: skip
    assert read_gguf(path).config["rope_parameters"] == hf["rope_parameters"]
    imported = import_model(path).model
    ids = torch.randint(0, 40, (1, 24), generator=torch.Generator().manual_seed(4))
    gap = (_logits(imported, ids) - _logits(model, ids)).abs().max().item()
    assert gap < 1e-4, gap


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer()


def _probe_llama(kind, tmp_path, tokenizer):
    """The tiny Hugging Face Llama with SECTIONS[kind], imported into probe."""
    model, out = hf_llama(SECTIONS[kind], tmp_path, vocab=VOCAB)
    tokenizer.save(str(out / "tokenizer.json"))
    return model, import_model(out)


@pytest.mark.parametrize("kind", list(SECTIONS))
def test_export_reads_back_to_the_same_section_and_logits(kind, tmp_path, tokenizer):
    hf_model, imported = _probe_llama(kind, tmp_path, tokenizer)
    model = imported.model
    path = export_gguf(model, "llama", tokenizer, tmp_path / "m.gguf", torch.float32).path
    back = import_model(path).model
    assert back.cfg.rope_scaling == model.cfg.rope_scaling
    params = back.cfg.rope_scaling.to_dict()
    params.pop("max_position_embeddings", None)  # yarn keeps the model's context
    assert params == {"kind": kind, **{k: v for k, v in SECTIONS[kind].items()
                                       if k != "rope_type"}}  # fmt: skip
    ids = torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    assert (_logits(back, ids) - _logits(model, ids)).abs().max().item() < 1e-4
    assert (_logits(model, ids) - _logits(hf_model, ids)).abs().max().item() < 1e-4


def test_exported_rope_freqs_divide_into_transformers_frequencies(tmp_path, tokenizer):
    """llama.cpp turns pair i by base^(-2i/d) / rope_freqs[i]: transformers' llama3 inv_freq."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_model, imported = _probe_llama("llama3", tmp_path, tokenizer)
    path = export_gguf(imported.model, "llama", tokenizer, tmp_path / "m.gguf").path
    reader = gguf.GGUFReader(str(path))
    freqs = next(np.array(t.data) for t in reader.tensors if t.name == "rope_freqs.weight")
    np.testing.assert_array_equal(freqs, converter_rope_freqs(SECTIONS["llama3"], 16))
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_model.config, "cpu")
    base = BASE ** -(np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(base / freqs, want.numpy(), rtol=1e-6)
    assert not any(f.name.startswith("llama.rope.scaling") for f in reader.fields.values())


F32 = gguf.GGUFValueType.FLOAT32
STR = gguf.GGUFValueType.STRING
BAD = [
    ({}, {"rope_freqs.weight": np.array([1, 2, 3, 9, 5, 6, 7, 8], np.float32)},
     "tensor 'rope_freqs.weight' holds per-pair rotary divisors that no Llama 3 scaling rebuilds"),
    ({}, {"rope_freqs.weight": np.ones(3, np.float32)}, "must hold 8 positive divisors"),
    ({"llama.rope.scaling.type": ("dynamic", STR)}, {}, "llama.rope.scaling.type = 'dynamic'"),
    ({"llama.rope.scaling.type": ("linear", STR)}, {}, "needs llama.rope.scaling.factor"),
    ({"llama.rope.scaling.type": ("linear", STR), "llama.rope.scaling.factor": (-2.0, F32)}, {},
     "llama.rope.scaling.factor must be a number >= 0"),
    ({"llama.rope.scaling.attn_factor": (2.0, F32)}, {}, "read for Phi-3 (longrope) only"),
    ({"llama.rope.scaling.type": ("yarn", STR), "llama.rope.scaling.factor": (4.0, F32),
      "llama.rope.scaling.yarn_ext_factor": (0.5, F32)}, {}, "yarn_ext_factor = 0.5"),
    ({"llama.rope.scaling.type": ("linear", STR), "llama.rope.scaling.factor": (4.0, F32)},
     {"rope_freqs.weight": np.ones(8, np.float32)}, "has no other rotary scaling"),
]  # fmt: skip


@pytest.mark.parametrize("kv, tensors, words", BAD, ids=[w[:24] for *_, w in BAD])
def test_scaling_probe_cannot_read_is_one_line(kv, tensors, words, tmp_path):
    model, _ = hf_llama({"rope_type": "default"}, tmp_path)
    plain = write_llama_like_converter(tmp_path / "m.gguf", model, {"rope_type": "default"})
    path = _rewrite(plain, "llama", kv, tensors)
    with pytest.raises(ProbeError) as e:
        read_gguf(path)
    assert words in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_a_factor_without_a_type_is_linear_as_llama_cpp_reads_it(tmp_path):
    model, _ = hf_llama({"rope_type": "default"}, tmp_path)
    plain = write_llama_like_converter(tmp_path / "m.gguf", model, {"rope_type": "default"})
    path = _rewrite(plain, "llama", {"llama.rope.scale_linear": (2.0, F32)})
    section = read_gguf(path).config["rope_parameters"]
    assert section == {"rope_type": "linear", "factor": 2.0, "rope_theta": BASE}


@pytest.mark.parametrize("section, words", [
    ({"rope_type": "dynamic", "factor": 2.0}, "cannot compute this model's 'dynamic'"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
      "attention_factor": 1.5}, "YaRN sets attention_factor"),
])  # fmt: skip
def test_export_refuses_what_llama_cpp_cannot_compute(section, words, tmp_path, tokenizer):
    _, out = hf_llama(section, tmp_path, vocab=VOCAB)
    tokenizer.save(str(out / "tokenizer.json"))
    model = import_model(out).model
    with pytest.raises(ProbeError) as e:
        export_gguf(model, "llama", tokenizer, tmp_path / "m.gguf")
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "m.gguf").exists()


# ------------------------------------------------------------------------------- llama.cpp itself
@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SECTIONS))
def test_llama_cpp_computes_probes_scaled_rotary_past_the_original_context(
    kind, tmp_path, tokenizer
):
    """A float32 export run by llama.cpp (float32 key/value cache, no flash attention) at 80
    positions, past the original context of 64: probe's logits within 1e-3 (measured: 3e-5 to
    6e-5)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)
    _, imported = _probe_llama(kind, tmp_path, tokenizer)
    model = imported.model
    path = export_gguf(imported.model, "llama", tokenizer, tmp_path / "m.gguf", torch.float32).path
    tokens = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(3))
    # llama-cpp-python's Llama() passes its own YaRN betas (32, 1) over the file's: given here
    betas = {f"yarn_{k}": SECTIONS[kind][k] for k in ("beta_fast", "beta_slow") if kind == "yarn"}
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False,
                          n_threads=1, type_k=0, type_v=0, flash_attn=False, **betas)  # fmt: skip
    llm.eval(tokens.tolist())
    got = np.array(llm.scores[:LENGTH])
    want = _logits(model, tokens[None])[0].numpy()
    gap = np.abs(got - want).max()
    assert gap < 1e-3, gap


@pytest.mark.parametrize(
    "scaling",
    [{"factor": 8.0, "original_max_position_embeddings": 100},
     {"factor": 0.5, "original_max_position_embeddings": 64}],
)  # fmt: skip
def test_a_llama3_scaling_the_file_could_not_carry_back_is_refused_before_writing(scaling):
    """rope_freqs.weight reads back as a llama3 section only for the values real checkpoints
    use; a model whose tensor would not (an original context of 100, a factor below 1) is
    refused by the export rather than written as a file its import refuses."""
    from probe.interop.gguf_rope import check_exportable
    from probe.rope import RopeScaling

    llama3 = RopeScaling("llama3", low_freq_factor=1.0, high_freq_factor=4.0, **scaling)
    with pytest.raises(ProbeError, match=r"would not\. Use --format hf"):
        check_exportable(llama3, 500000.0, 16)
    check_exportable(RopeScaling("llama3", 8.0, 64, low_freq_factor=1.0, high_freq_factor=4.0),
                     500000.0, 16)  # fmt: skip
