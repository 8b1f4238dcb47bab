"""The rotary kinds table against transformers 5.25 itself: for every kind, with the parameters
of real checkpoints' configs, the frequencies are `torch.equal` and the attention factor `==` to
what transformers' `ROPE_INIT_FUNCTIONS` (and, for the length-dependent kinds, its rotary module
after a forward) compute; static NTK against its formula; bad sections give one line naming the
field; a Hugging Face section survives read then write."""

from __future__ import annotations

import math

import pytest
import torch

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.interop.hf_rope import rope_scaling_from_hf, rope_scaling_to_hf
from probe.model.positional import Rotary
from probe.rope import KINDS, RopeScaling

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_transformers")


def _plausible_factors(pairs: int, top: float) -> list[float]:
    """Per-pair factors rising smoothly from 1 to `top`, like Phi-3.5's (not its real values)."""
    return [1.0 + (top - 1.0) * (i / (pairs - 1)) ** 3 for i in range(pairs)]


PHI35_SHORT = [round(1.0 + 0.03 * i / 47, 6) for i in range(48)]  # 1.0 .. 1.03
PHI35_LONG = [round(x, 4) for x in _plausible_factors(48, 64.8)]  # 1.0 .. 64.8

# name -> (rope_theta, head_dim, partial rotary, max_position_embeddings, section)
CASES = {
    "llama-3.1-8b": (5e5, 128, 1.0, 131072, {"rope_type": "llama3", "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),
    "llama-3.2-1b": (5e5, 64, 1.0, 131072, {"rope_type": "llama3", "factor": 32.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),
    "qwen3-yarn": (1e6, 128, 1.0, 131072, {"rope_type": "yarn", "factor": 4.0,
                   "original_max_position_embeddings": 32768}),
    "gpt-oss": (150000.0, 64, 1.0, 131072, {"rope_type": "yarn", "factor": 32.0,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}),
    "deepseek-yarn": (10000.0, 64, 1.0, 163840, {"rope_type": "yarn", "factor": 40,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8,
                      "original_max_position_embeddings": 4096}),
    "yarn-derived-factor": (10000.0, 64, 1.0, 16384, {"rope_type": "yarn", "factor": None,
                            "original_max_position_embeddings": 4096}),
    "yarn-attention-factor": (10000.0, 64, 0.5, 16384, {"rope_type": "yarn", "factor": 4.0,
                              "attention_factor": 1.5, "original_max_position_embeddings": 4096}),
    "phi-3.5-mini": (10000.0, 96, 1.0, 131072, {"rope_type": "longrope",
                     "short_factor": PHI35_SHORT, "long_factor": PHI35_LONG,
                     "original_max_position_embeddings": 4096}),
    "linear-4": (10000.0, 64, 1.0, 8192, {"rope_type": "linear", "factor": 4.0}),
    "linear-partial": (10000.0, 80, 0.25, 8192, {"rope_type": "linear", "factor": 2.5}),
    "dynamic-2": (10000.0, 64, 1.0, 2048, {"rope_type": "dynamic", "factor": 2.0}),
    "dynamic-odd": (1e6, 128, 1.0, 3000, {"rope_type": "dynamic", "factor": 2.7}),
}  # fmt: skip
LENGTHS = (None, 1, 2047, 2048, 2049, 3000, 3001, 4096, 4097, 5000, 8191, 32768, 32769, 100_000)


def _hf_config(theta, head_dim, fraction, max_pos, section):
    parameters = {**section, "rope_theta": theta}
    if fraction != 1.0:
        parameters["partial_rotary_factor"] = fraction
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=max_pos, rope_parameters=parameters)  # fmt: skip


def _ours(name, length):
    theta, head_dim, fraction, max_pos, section = CASES[name]
    scaling = rope_scaling_from_hf(dict(section), max_position_embeddings=max_pos)
    return KINDS[scaling.kind](theta, int(head_dim * fraction), scaling, length)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("length", LENGTHS)
def test_kind_equals_transformers_init_function(name, length):
    """As transformers' model calls it: the load-time frequencies with seq_len None, and past
    the context (dynamic) the current length as the 0-d tensor max(position_ids) + 1."""
    theta, head_dim, fraction, max_pos, section = CASES[name]
    hf = _hf_config(theta, head_dim, fraction, max_pos, section)
    seq_len = length
    if section["rope_type"] == "dynamic" and length is not None and length > max_pos:
        seq_len = torch.tensor(length)
    want, want_attention = ROPE_INIT_FUNCTIONS[section["rope_type"]](hf, None, seq_len=seq_len)
    got, attention = _ours(name, length)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got, want), (got - want).abs().max()
    assert attention == want_attention


def _phi35(section):
    """Phi-3.5-mini's shape: 32 heads of 96 dims, 131,072 positions, original 4,096 at the top."""
    return Phi3Config(
        hidden_size=3072,
        num_attention_heads=32,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_scaling=dict(section),
    )


@pytest.mark.parametrize("name", ["dynamic-2", "dynamic-odd", "linear-4", "llama-3.1-8b"])
def test_runtime_frequencies_equal_transformers_rotary_module(name):
    """The frequencies transformers' Llama rotary module holds after a forward at each length
    (a fresh module each time: its dynamic frequencies also depend on what it saw before)."""
    theta, head_dim, fraction, max_pos, section = CASES[name]
    hf = _hf_config(theta, head_dim, fraction, max_pos, section)
    for length in (1, max_pos - 1, max_pos, max_pos + 1, 2 * max_pos + 7, 4 * max_pos):
        module = LlamaRotaryEmbedding(hf)
        module(torch.zeros(1), torch.arange(length)[None])
        got, attention = _ours(name, length)
        assert torch.equal(got, module.inv_freq), length
        assert attention == module.attention_scaling


def test_longrope_switch_equals_phi3_rotary_module():
    """Phi-3.5-mini as its config.json has it (old `type` key, original context at the top
    level): short factors up to 4,096 tokens, long ones from 4,097, attention factor
    sqrt(1 + ln 32 / ln 4096) = 1.19 from max_position_embeddings / original."""
    section = {"type": "longrope", "short_factor": PHI35_SHORT, "long_factor": PHI35_LONG}
    hf = _phi35(section)
    scaling = rope_scaling_from_hf(section, 131072, original_max_position_embeddings=4096)
    for length in (1, 4095, 4096, 4097, 8192, 131072):
        module = Phi3RotaryEmbedding(hf)
        module(torch.zeros(1), torch.arange(length)[None])
        got, attention = KINDS["longrope"](10000.0, 96, scaling, length)
        assert torch.equal(got, module.inv_freq), length
        assert attention == module.attention_scaling == math.sqrt(1 + math.log(32) / math.log(4096))
    short, _ = KINDS["longrope"](10000.0, 96, scaling, 4096)
    long, _ = KINDS["longrope"](10000.0, 96, scaling, 4097)
    assert not torch.equal(short, long)


def test_yarn_bands_match_the_measured_ones():
    """Independent of transformers: the background's measured bands (pairs unchanged, divided
    by s, between) and logit scale for gpt-oss (9/14/9, x1.813) and Qwen3 (24/24/16, x1.297)."""
    measured = (("gpt-oss", (9, 14, 9), 1.813), ("qwen3-yarn", (24, 24, 16), 1.297))
    for name, bands, logit_scale in measured:
        theta, head_dim, _, _, section = CASES[name]
        got, attention = _ours(name, None)
        base, _ = KINDS["default"](theta, head_dim, RopeScaling())
        ratio = (base / got).double()  # 1 where unchanged, s where divided
        unchanged = int((ratio == 1).sum())
        divided = int(
            torch.isclose(ratio, torch.tensor(section["factor"]).double(), rtol=1e-6).sum()
        )
        assert (unchanged, divided, len(ratio) - unchanged - divided) == bands
        assert attention**2 == pytest.approx(logit_scale, abs=1e-3)


NTK_CASES = [(10000.0, 64, 2.0), (5e5, 128, 8.0), (1e4, 32, 1.0)]


@pytest.mark.parametrize(("theta", "dims", "alpha"), NTK_CASES)
def test_ntk_against_its_formula(theta, dims, alpha):
    """Static NTK-aware scaling as the YaRN repository's LlamaNTKScaledRotaryEmbedding computes
    it (base * alpha ** (dim / (dim - 2)), then 1 / base^(2i/d)); and, in float64, every pair's
    frequency is the default one times alpha ** (-2i / (d - 2))."""
    got, attention = KINDS["ntk"](theta, dims, RopeScaling("ntk", alpha=alpha))
    base = theta * alpha ** (dims / (dims - 2))
    assert torch.equal(got, 1.0 / (base ** (torch.arange(0, dims, 2).float().to("cpu") / dims)))
    assert attention == 1.0
    i = torch.arange(dims // 2, dtype=torch.float64)
    exact = theta ** (-2 * i / dims) * alpha ** (-2 * i / (dims - 2))
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=0)


@pytest.mark.parametrize(("theta", "head_dim", "fraction"),
                         [(10000.0, 64, 1.0), (5e5, 128, 1.0), (1e6, 128, 1.0), (10000.0, 80, 0.25),
                          (10000.0, 256, 0.5), (150000.0, 64, 1.0)])  # fmt: skip
def test_rotary_default_frequencies_equal_transformers(theta, head_dim, fraction):
    """probe's `Rotary` holds exactly transformers' default frequencies (GPT-NeoX's function,
    which reads the rotated fraction), and keeps them so through a dtype cast."""
    cfg = ModelConfig(d_model=head_dim * 2, n_head=2, pe="rope", rope_base=theta,
                      rope_fraction=fraction)  # fmt: skip
    hf = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                     rope_parameters={"rope_type": "default", "rope_theta": theta,
                                      "partial_rotary_factor": fraction})  # fmt: skip
    want, _ = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(hf)
    rotary = Rotary(cfg)
    assert torch.equal(rotary.inv_freq, want)
    assert torch.equal(rotary.to(torch.bfloat16).inv_freq, want)
    if fraction == 1.0:
        assert torch.equal(LlamaRotaryEmbedding.compute_default_rope_parameters(hf)[0], want)


def test_rotary_linear_factor_equals_transformers():
    cfg = ModelConfig(d_model=512, n_head=2, pe="rope", rope_base=1e6)
    hf = _hf_config(1e6, 256, 1.0, 8192, {"rope_type": "linear", "factor": 8.0})
    want, _ = ROPE_INIT_FUNCTIONS["linear"](hf, None)
    assert torch.equal(Rotary(cfg, 1e6, RopeScaling("linear", 8.0)).inv_freq, want)


BAD = [
    ({"rope_type": "yran", "factor": 2.0}, "'yran'", "Did you mean 'yarn'?"),
    ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings", "missing"),
    ({"rope_type": "linear", "factor": 0}, "'factor'", "> 0"),
    ({"rope_type": "linear", "factor": -2.0}, "'factor'", "> 0"),
    ({"rope_type": "linear", "factor": float("nan")}, "'factor'", "nan"),
    ({"rope_type": "linear", "factor": float("inf")}, "'factor'", "inf"),
    ({"rope_type": "linear", "factor": True}, "'factor'", "True"),
    ({"rope_type": "linear", "factor": "4"}, "'factor'", "'4'"),
    ({"rope_type": "linear"}, "'factor'", "missing"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 32}, "'beta_fast'", "no parameter"),
    ({"rope_type": "linear", "facter": 2.0}, "'facter'", "Did you mean 'factor'?"),
    ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, "'rope_type'", "'type'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8192}, "'high_freq_factor'", "greater"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192.5}, "original_max_position_embeddings", "whole"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 32,
      "original_max_position_embeddings": 4096}, "'beta_fast'", "greater"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": "no",
      "original_max_position_embeddings": 4096}, "'truncate'", "true or false"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": -1.0,
      "original_max_position_embeddings": 4096}, "'mscale'", ">= 0"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 47,
      "original_max_position_embeddings": 4096, "factor": 32.0}, "'long_factor'", "47"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 47 + [float("nan")],
      "long_factor": [2.0] * 48, "original_max_position_embeddings": 4096},
     "'short_factor'", "nan"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
      "original_max_position_embeddings": 4096}, "'factor'", "max_position_embeddings"),
    ({"rope_type": "dynamic", "factor": 2.0}, "'max_position_embeddings'", "missing"),
    ({"rope_type": "ntk"}, "'ntk' is probe's own", "transformers has none"),
    ({"rope_type": "default", "mrope_section": [16, 24, 24]}, "'mrope_section'", "does not know"),
]  # fmt: skip


@pytest.mark.parametrize(("section", "field", "detail"), BAD)
def test_bad_section_is_one_line_naming_the_field(section, field, detail):
    with pytest.raises(ProbeError) as error:
        rope_scaling_from_hf(section)
    message = str(error.value)
    assert "\n" not in message
    assert field in message and detail in message, message


def test_unknown_kind_lists_the_supported_ones():
    with pytest.raises(ProbeError, match=r"Available: default, linear, dynamic, yarn, llama3, "
                                         r"longrope, ntk\.$"):  # fmt: skip
        RopeScaling("proportional")


def test_longrope_factors_of_the_wrong_length_for_the_head():
    """48 factors fit 96 rotated dims; 128 dims need 64, one per pair."""
    theta, _, _, max_pos, section = CASES["phi-3.5-mini"]
    scaling = rope_scaling_from_hf(section, max_pos)
    with pytest.raises(
        ProbeError, match=r"'short_factor' has 48 entries; 128 rotated dims need 64"
    ):
        KINDS["longrope"](theta, 128, scaling, None)


@pytest.mark.parametrize("name", CASES)
def test_section_survives_read_then_write(name):
    """The section as a config.json carries it, and as transformers 5.25 saves it (with the
    model's rope_theta and partial_rotary_factor in it)."""
    theta, head_dim, fraction, max_pos, section = CASES[name]
    assert rope_scaling_to_hf(rope_scaling_from_hf(section, max_pos)) == section
    saved = _hf_config(theta, head_dim, fraction, max_pos, section).to_dict()["rope_parameters"]
    read = rope_scaling_from_hf(saved, max_pos)
    written = rope_scaling_to_hf(read, saved["rope_theta"], saved.get("partial_rotary_factor"))
    assert written == saved


def test_old_spellings_read_as_the_new_one():
    """`type` for `rope_type` reads as transformers 5.25 reads it ("su" for longrope is Phi-3's
    alone: `hf_phi3` renames it, anywhere else it is unknown, as transformers' KeyError says),
    and the section written back (in 5.25's spelling) gives transformers the same frequencies."""
    new = {"rope_type": "longrope", "short_factor": PHI35_SHORT, "long_factor": PHI35_LONG}
    want = rope_scaling_from_hf(new, 131072, 4096)
    old = {"type": "longrope", **{k: v for k, v in new.items() if k != "rope_type"}}
    assert rope_scaling_from_hf(old, 131072, 4096) == want
    with pytest.raises(ProbeError, match="Unknown rotary scaling kind 'su'"):
        rope_scaling_from_hf({**old, "type": "su"}, 131072, 4096)
    written = rope_scaling_to_hf(want)
    assert written == {**new, "original_max_position_embeddings": 4096}
    for section in ({"type": "su", **{k: v for k, v in new.items() if k != "rope_type"}}, written):
        hf = _phi35(section)
        for length in (None, 4097):
            got, attention = KINDS["longrope"](10000.0, 96, want, length)
            inv_freq, hf_attention = ROPE_INIT_FUNCTIONS["longrope"](hf, None, seq_len=length)
            assert torch.equal(got, inv_freq) and attention == hf_attention


def test_no_section_is_default_and_ntk_has_no_hf_spelling():
    assert rope_scaling_from_hf(None) == RopeScaling() == rope_scaling_from_hf({})
    assert rope_scaling_from_hf({"rope_type": "default", "rope_theta": 1e4}) == RopeScaling()
    with pytest.raises(ProbeError, match="transformers has no rotary scaling kind 'ntk'"):
        rope_scaling_to_hf(RopeScaling("ntk", alpha=2.0))


@pytest.mark.parametrize(
    "scaling",
    [RopeScaling("ntk", alpha=1e300), RopeScaling("ntk", alpha=1e-300),
     RopeScaling("linear", 1e-300), RopeScaling("dynamic", 1e300, max_position_embeddings=64),
     RopeScaling("yarn", 1e-300, original_max_position_embeddings=64)],
)  # fmt: skip
def test_parameters_far_out_of_range_are_one_line_not_nan_logits(scaling):
    """An overflow, or frequencies that are not finite and positive, is refused naming the
    scaling (as the command line's extreme --rope-factor / --rope-alpha would otherwise give a
    table of NaN losses, or an OverflowError)."""
    with pytest.raises(ProbeError, match=r"gives frequencies that are not finite") as err:
        KINDS[scaling.kind](10000.0, 16, scaling)
    assert scaling.kind in str(err.value)
