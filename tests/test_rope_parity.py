"""Every rotary scaling kind against transformers 5.25 end to end, at and past the original
context: tiny random checkpoints built with transformers' own config classes and real models'
rotary sections (the context L shrunk to 64), imported into probe, give transformers' eager
float32 logits within 1e-4 at L-1, L, L+1, 2L and 4L (a fresh transformers model at each
length: its dynamic NTK keeps the frequencies of the longest input it saw, which a test below
shows); dropping the scaling changes them by far more, so the comparison can fail. Cached
generation across L (dynamic, longrope) equals transformers' full forwards and fails without its
re-prefill; an export carries the same rotary section and logits back to transformers. The
families at 4,096 tokens with real rotary bases (slow) guard the frequencies' float32 rounding:
one rounding apart drifts the logits past 1e-4 there.

Weights have std 0.2 (logits of a few units, peaked attention), so positions matter."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

import probe.measure.generate as generation
from probe.errors import ProbeError
from probe.interop.export import export_hf
from probe.interop.importer import import_model
from probe.measure.generate import generate
from probe.model import Transformer
from probe.model.positional import Rotary
from probe.rope import KINDS, UNSCALED

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB = 99
L = 64  # the original (pre-training) context, shrunk
LENGTHS = (L - 1, L, L + 1, 2 * L, 4 * L)
# head_dim 16: 8 rotated pairs, enough for llama3's and yarn's three bands at L = 64
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, intermediate_size=48, bos_token_id=None,
             eos_token_id=None, pad_token_id=None)  # fmt: skip


def _rising(pairs: int, low: float, top: float) -> list[float]:
    """Per-pair factors rising smoothly from `low` to `top`, shaped like Phi-3.5's."""
    return [round(low + (top - low) * (i / (pairs - 1)) ** 3, 4) for i in range(pairs)]


def _yarn(factor: float, theta: float, **more) -> dict:
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L,
            "rope_theta": theta, **more}  # fmt: skip


def _llama3(factor: float) -> dict:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": L,
            "rope_theta": 5e5}  # fmt: skip


def _longrope(pairs: int) -> dict:
    return {"rope_type": "longrope", "short_factor": _rising(pairs, 1.0, 1.05),
            "long_factor": _rising(pairs, 1.0, 48.0), "rope_theta": 10000.0}  # fmt: skip


# name -> (transformers config class, top-level keys, rotary section), each as the real model's
# config.json has it with its context (8,192 / 32,768 / 4,096 tokens) shrunk to L
CASES = {
    "llama-3.1": ("LlamaConfig", {"max_position_embeddings": 16 * L}, _llama3(8.0)),
    "llama-3.2": ("LlamaConfig", {"max_position_embeddings": 16 * L}, _llama3(32.0)),
    "qwen2-yarn": ("Qwen2Config", {"max_position_embeddings": L}, _yarn(4.0, 1e6)),
    "qwen3-yarn": ("Qwen3Config", {"max_position_embeddings": L * 5 // 4}, _yarn(4.0, 1e6)),
    "gpt-oss-yarn": ("LlamaConfig", {"max_position_embeddings": 32 * L},
                     _yarn(32.0, 150000.0, beta_fast=32.0, beta_slow=1.0, truncate=False)),
    "deepseek-yarn": ("LlamaConfig", {"max_position_embeddings": 40 * L},
                      _yarn(40.0, 10000.0, beta_fast=32, beta_slow=1, mscale=1.0,
                            mscale_all_dim=0.8)),
    "phi-3.5-longrope": ("Phi3Config", {"max_position_embeddings": 32 * L,
                                        "original_max_position_embeddings": L}, _longrope(8)),
    "phi-4-mini-longrope": ("Phi3Config", {"max_position_embeddings": 32 * L,
                                           "original_max_position_embeddings": L,
                                           "partial_rotary_factor": 0.75}, _longrope(6)),
    "smollm-linear": ("LlamaConfig", {"max_position_embeddings": L},
                      {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "llama-dynamic": ("LlamaConfig", {"max_position_embeddings": L},
                      {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
}  # fmt: skip
BY_LENGTH = ["llama-dynamic", "phi-3.5-longrope", "phi-4-mini-longrope"]


pytestmark = pytest.mark.usefixtures("quiet_transformers")


def sharpen(model, seed: int = 0) -> None:
    """Weights of std 0.2, norms and biases moved off 1 and 0: peaked attention, logits of a few
    units, so a position's rotation shows in them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def save(hf_config, path):
    """A random transformers model of `hf_config`, sharpened, saved in `path`."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    sharpen(model)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> the directory of that case's checkpoint, built once per module."""
    root, made = tmp_path_factory.mktemp("rope-parity"), {}

    def get(name: str):
        if name not in made:
            cls, top, section = CASES[name]
            hf = getattr(transformers, cls)(**SHAPE, **top, rope_parameters=dict(section))
            made[name] = save(hf, root / name)
        return made[name]

    return get


def fresh(path):
    """transformers' model of `path`, new (no rotary state), eager attention, float32."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), attn_implementation="eager", dtype=torch.float32
    ).eval()


def tokens(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))


@torch.no_grad()
def gap(ours: Transformer, ref, seq: torch.Tensor) -> float:
    """max |logit gap| between probe's model and transformers' on seq [batch, len]."""
    return float((ours(seq) - ref(seq).logits).abs().max())


def plain(model: Transformer) -> Transformer:
    """`model` with its rotary scaling dropped (the default rotary at the same base)."""
    cfg = dataclasses.replace(model.cfg, rope_scaling=UNSCALED)
    out = Transformer(cfg).eval()
    out.load_state_dict(model.state_dict())
    return out


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", CASES)
def test_logits_equal_transformers_at_and_past_the_original_context(name, length, saved):
    model = import_model(saved(name)).model.eval()
    assert model.cfg.rope_scaling.kind == CASES[name][2]["rope_type"]
    assert gap(model, fresh(saved(name)), tokens(length)) <= TOL


def older_spelling(path, name: str):
    """The checkpoint at `path` with its config.json as the real models' files spell it: a
    `rope_scaling` section under `type` (Phi-3.5: `su`), `rope_theta` and the rotated fraction
    at the top level, Phi-3's original context only there."""
    config = json.loads((path / "config.json").read_text())
    section = dict(config.pop("rope_parameters"))
    config["rope_theta"] = section.pop("rope_theta")
    if "partial_rotary_factor" in section:
        config["partial_rotary_factor"] = section.pop("partial_rotary_factor")
    if "original_max_position_embeddings" in config:
        section.pop("original_max_position_embeddings")
    kind = section.pop("rope_type")
    config["rope_scaling"] = {"type": "su" if name == "phi-3.5-longrope" else kind, **section}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("name", CASES)
def test_the_older_rope_scaling_spelling_reads_as_transformers_reads_it(name, saved, tmp_path):
    path = older_spelling(Path(shutil.copytree(saved(name), tmp_path / name)), name)
    model = import_model(path).model.eval()
    for length in (L, L + 1, 4 * L):
        assert gap(model, fresh(path), tokens(length)) <= TOL, length


@pytest.mark.parametrize("name", CASES)
def test_without_its_scaling_the_model_differs_past_the_context(name, saved):
    """The comparison above can fail: the same weights with the default rotary are far off."""
    model = plain(import_model(saved(name)).model)
    assert gap(model, fresh(saved(name)), tokens(4 * L)) > 100 * TOL


def _default_frequencies(theta: float, dims: int) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims)  # [pairs]


@pytest.mark.parametrize("name", CASES)
def test_the_scaled_frequencies_differ_from_the_default_ones(name, saved):
    """What transformers rotates by at 4L (read from its rotary module after a forward) is not
    the default rotary; llama3 and yarn have pairs kept, pairs divided by the factor and pairs
    on the ramp between, so all three bands are exercised."""
    ref = fresh(saved(name))
    with torch.no_grad():
        ref(tokens(4 * L, batch=1))
    rotary = ref.model.rotary_emb
    section, dims = CASES[name][2], rotary.inv_freq.numel() * 2
    ratio = _default_frequencies(section["rope_theta"], dims) / rotary.inv_freq.double()  # [pairs]
    assert not torch.allclose(ratio, torch.ones_like(ratio), rtol=1e-3), ratio
    if section["rope_type"] in ("llama3", "yarn"):
        factor = section["factor"]
        kept = torch.isclose(ratio, torch.tensor(1.0, dtype=torch.float64), rtol=1e-5)
        divided = torch.isclose(ratio, torch.tensor(factor, dtype=torch.float64), rtol=1e-5)
        assert kept.any() and divided.any() and not (kept | divided).all(), ratio
    if section["rope_type"] in ("yarn", "longrope"):  # an attention factor of its own
        assert rotary.attention_scaling > 1.0


def test_transformers_dynamic_keeps_the_frequencies_of_the_longest_input(saved):
    """transformers' dynamic NTK keeps the frequencies of the longest input it has seen until
    one within L comes; probe's are a function of the current length (a fresh model's)."""
    path = saved("llama-dynamic")
    model, seen = import_model(path).model.eval(), fresh(path)
    with torch.no_grad():
        seen(tokens(4 * L))
    assert gap(model, seen, tokens(2 * L)) > 100 * TOL  # 4L's frequencies at 2L
    assert gap(model, fresh(path), tokens(2 * L)) <= TOL
    assert gap(model, seen, tokens(L - 1)) <= TOL  # back within L: reset to the original ones


NEW = 8  # generated tokens: lengths L-3 .. L+4, across the original context


@pytest.mark.parametrize("name", BY_LENGTH)
def test_cached_generation_across_the_context_equals_full_forwards(name, saved):
    """`check` compares every cached step with probe's full forward; the greedy tokens are
    those of transformers' full forward (a fresh model) at every length."""
    model = import_model(saved(name)).model.eval()
    prompt = tokens(L - 3)
    out = generate(model, prompt, NEW, check=True)
    seq = prompt
    with torch.no_grad():
        for _ in range(NEW):
            logits = fresh(saved(name))(seq).logits[:, -1]  # [batch, vocab]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("name", BY_LENGTH)
def test_without_the_re_prefill_cached_generation_fails_its_check(name, saved, monkeypatch):
    """Keeping the keys cached before L (rotated by frequencies of a shorter length) is what
    the re-prefill avoids: without it the check sees the gap past L."""
    model = import_model(saved(name)).model.eval()
    monkeypatch.setattr(generation, "rotary_changes", lambda *args: False)
    with pytest.raises(ProbeError, match=r"cached decoding differs .* \(sequence length 6[5-8]\)"):
        generate(model, tokens(L - 3), NEW, check=True)


@pytest.mark.parametrize("name", CASES)
def test_export_carries_the_rotary_section_and_the_logits(name, saved, tmp_path):
    """The exported config.json has the source's rotary section, key for key (and its
    top-level context, original context and rotated fraction); transformers loads it and
    computes the source's logits."""
    source = saved(name)
    imported = import_model(source)
    out = tmp_path / "exported"
    export_hf(imported.model, imported.source["model_type"], out)
    want = json.loads((source / "config.json").read_text())
    got = json.loads((out / "config.json").read_text())
    assert got["rope_parameters"] == want["rope_parameters"]
    for key in ("max_position_embeddings", "original_max_position_embeddings"):
        assert got.get(key) == want.get(key)
    if "partial_rotary_factor" in want:
        assert got["partial_rotary_factor"] == want["partial_rotary_factor"]
    for length in (L, L + 1, 4 * L):
        seq = tokens(length)
        with torch.no_grad():
            theirs = fresh(out)(seq).logits
            source_logits = fresh(source)(seq).logits
        assert (theirs - source_logits).abs().max() <= TOL
    assert fresh(out).config.rope_parameters == fresh(source).config.rope_parameters


# ---- the families at 4,096 tokens with their real bases ------------------------------------

LONG = 4096
# head_dim 64 (32 pairs) as in real models; GQA: both heads share one key/value head
WIDE = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=96, max_position_embeddings=2 * LONG, bos_token_id=None,
            eos_token_id=None, pad_token_id=None)  # fmt: skip
GQA = dict(num_key_value_heads=1)
WINDOW = 64


def _family(kind: str):
    """A tiny transformers config of `kind` with its real model's rotary base (and window)."""
    tf = transformers
    if kind == "llama":  # Llama 3
        return tf.LlamaConfig(**WIDE, **GQA, rope_parameters={"rope_type": "default",
                                                              "rope_theta": 5e5})  # fmt: skip
    if kind == "qwen2":  # the second layer windowed
        return tf.Qwen2Config(**WIDE, **GQA, use_sliding_window=True, sliding_window=WINDOW,
                              max_window_layers=1, rope_parameters={"rope_type": "default",
                                                                    "rope_theta": 1e6})  # fmt: skip
    if kind == "mistral":
        return tf.MistralConfig(**WIDE, **GQA, sliding_window=WINDOW,
                                rope_parameters={"rope_type": "default",
                                                 "rope_theta": 1e6})  # fmt: skip
    if kind == "gemma2":  # local and global layers, one base
        return tf.Gemma2Config(**WIDE, **GQA, head_dim=64, sliding_window=WINDOW,
                               query_pre_attn_scalar=64)  # fmt: skip
    if kind == "gemma3_text":  # local layers at 10,000, global ones at 1e6 with linear 8
        return tf.Gemma3TextConfig(**WIDE, **GQA, head_dim=64, sliding_window=WINDOW,
                                   layer_types=["sliding_attention", "full_attention"],
                                   rope_parameters={
                                       "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                          "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default",
                                                             "rope_theta": 10000.0}})  # fmt: skip
    if kind == "olmo2":
        return tf.Olmo2Config(**WIDE, **GQA, rope_parameters={"rope_type": "default",
                                                              "rope_theta": 5e5})  # fmt: skip
    if kind == "gpt_neox":  # Pythia: a quarter of each head rotated
        return tf.GPTNeoXConfig(**WIDE, rotary_pct=0.25)
    if kind == "phi3":
        return tf.Phi3Config(**WIDE, **GQA)
    raise ValueError(kind)


FAMILIES = ["llama", "qwen2", "mistral", "gemma2", "gemma3_text", "olmo2", "gpt_neox", "phi3"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", FAMILIES)
def test_families_at_4096_tokens_equal_transformers(kind, tmp_path):
    path = save(_family(kind), tmp_path / kind)
    model = import_model(path).model.eval()
    assert gap(model, fresh(path), tokens(LONG, batch=1)) <= TOL


@pytest.mark.slow
def test_one_float32_rounding_in_the_frequencies_shows_at_4096_tokens(tmp_path):
    """What the test above guards: θ_i computed as base^(-2i/d) (one rounding apart from
    transformers' 1 / base^(2i/d)) moves Llama 3's logits past 1e-4 at 4,096 tokens."""
    path = save(_family("llama"), tmp_path / "llama")
    model, seq = import_model(path).model.eval(), tokens(LONG, batch=1)
    ref = fresh(path)
    for module in model.modules():
        if isinstance(module, Rotary):
            exponent = torch.arange(0, module.dims, 2).float() / module.dims  # [pairs]
            apart = module.base**-exponent  # [pairs]
            assert not torch.equal(apart, module.inv_freq)
            module.inv_freq = apart
    assert gap(model, ref, seq) > TOL


def test_every_kind_transformers_computes_has_a_case():
    """probe's kinds that a Hugging Face config can carry are all exercised above."""
    covered = {section["rope_type"] for _, _, section in CASES.values()}
    assert {k for k, v in KINDS.items() if v.in_transformers} - {"default"} <= covered
