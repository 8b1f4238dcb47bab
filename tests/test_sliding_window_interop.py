"""Sliding-window Mistral and Qwen2 imported from transformers compute transformers' logits past
the window (float32, within 1e-4; bf16 and fp16 within `precision.assert_matches_reference`), a
window one key wider or narrower does not, and an exported windowed model loads in transformers
with the same logits and imports back to the same config."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch
from precision import HALF, assert_matches_reference

from probe.interop.export import export_hf
from probe.interop.importer import import_model
from probe.model import Transformer

transformers = pytest.importorskip("transformers")

TOL = 1e-4
SEQ = 26  # longer than every window below


def tiny(kind: str, **kw):
    torch.manual_seed(0)
    shape = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64)  # fmt: skip
    if kind == "mistral":
        cfg = transformers.MistralConfig(**shape, num_hidden_layers=2, **kw)
        model = transformers.MistralForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**shape, num_hidden_layers=3, **kw)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for name, p in model.named_parameters():
            if "proj" in name and name.endswith("weight"):
                p.normal_(0.0, 0.3)
            elif name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


class Weights:
    needs_weights = True

    def record(self, call) -> None:
        pass


def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 99, (2, SEQ), generator=g)


def logits_gap(probe_model, ref) -> float:
    t = tokens()
    with torch.no_grad():
        return float((probe_model(t) - ref(t).logits).abs().max())


QWEN2_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
CASES = {  # name: (family, transformers config, window, windowed layers (None: all))
    "mistral-4": ("mistral", dict(sliding_window=4), 4, None),
    "mistral-8": ("mistral", dict(sliding_window=8), 8, None),
    "qwen2-4-from-layer-1": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
        4,
        (1, 2),
    ),
    "qwen2-8-layer-types": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=8, layer_types=QWEN2_TYPES),
        8,
        (0, 2),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_windowed_logits_match_transformers_past_the_window(case, tmp_path):
    kind, kw, window, layers = CASES[case]
    ref = tiny(kind, **kw)
    ref.save_pretrained(tmp_path / case)
    model = import_model(tmp_path / case).model
    assert (model.cfg.sliding_window, model.cfg.window_layers) == (window, layers)
    assert logits_gap(model, ref) < TOL
    t, keep = tokens(), torch.ones(2, SEQ, dtype=torch.bool)
    keep[1, 15:] = False  # right padding: the rows past it see no key once the window moves on
    with torch.no_grad():
        got = model(t, key_mask=keep)
        want = ref(t, attention_mask=keep.long()).logits
    assert float((got - want)[keep].abs().max()) < TOL and got.isfinite().all()
    with model.observe(Weights()):  # the explicit path, which materializes the weights
        assert logits_gap(model, ref) < TOL
    # off by one either way is visibly another function: the comparison above can fail
    for wrong in (window - 1, window + 1):
        other = Transformer(dataclasses.replace(model.cfg, sliding_window=wrong)).eval()
        other.load_state_dict(model.state_dict())
        assert logits_gap(other, ref) > 100 * TOL, wrong


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", ["mistral-4", "qwen2-4-from-layer-1"])
def test_windowed_half_precision_matches_transformers_in_the_same_dtype(case, dtype, tmp_path):
    """bf16/fp16 past the window, with right padding whose rows see no key once the window
    moves on (no NaN in half precision either), against transformers in the same dtype."""
    kind, kw, _, _ = CASES[case]
    source = tiny(kind, **kw)
    with torch.no_grad():  # logits of a few units, so that top-1 is mostly clear in bf16
        source.get_input_embeddings().weight.normal_(0.0, 0.3)
        source.get_output_embeddings().weight.normal_(0.0, 0.3)
        for name, p in source.named_parameters():
            if "proj" in name and name.endswith("weight"):
                p.mul_(0.5)  # std 0.15: still far from uniform attention, less chaotic
    source.save_pretrained(tmp_path / case)
    t, keep = tokens(), torch.ones(2, SEQ, dtype=torch.bool)
    keep[1, 15:] = False

    def reference(dtype):
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / case), dtype=dtype)
        with torch.no_grad():
            return ref.eval()(t, attention_mask=keep.long()).logits

    theirs32, theirs = reference(torch.float32), reference(dtype)
    model = import_model(tmp_path / case).model.to(dtype)
    for observer in (None, Weights()):
        with torch.no_grad(), model.observe(observer) if observer else contextlib.nullcontext():
            ours = model(t, key_mask=keep)
        assert ours.isfinite().all()
        assert_matches_reference(ours, theirs, theirs32, keep)


def test_windows_transformers_does_not_use_are_not_imported(tmp_path):
    """Qwen2 without use_sliding_window, and Mistral with sliding_window null, see every key."""
    for kind, kw in (("qwen2", dict(sliding_window=4)), ("mistral", dict(sliding_window=None))):
        ref = tiny(kind, **kw)
        ref.save_pretrained(tmp_path / kind)
        model = import_model(tmp_path / kind).model
        assert model.cfg.sliding_window is None
        assert logits_gap(model, ref) < TOL


def test_a_mistral_config_without_the_key_has_transformers_default_window(tmp_path):
    ref = tiny("mistral", sliding_window=8)
    ref.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["sliding_window"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    loaded = transformers.AutoConfig.from_pretrained(str(tmp_path / "m"))
    assert import_model(tmp_path / "m").model.cfg.sliding_window == loaded.sliding_window == 4096


def test_bad_window_keys_are_one_clear_error(tmp_path):
    from probe.errors import ProbeError

    ref = tiny("qwen2", use_sliding_window=True, sliding_window=4)
    ref.save_pretrained(tmp_path / "q")
    path = tmp_path / "q" / "config.json"
    good = json.loads(path.read_text())
    for change, match in (
        ({"sliding_window": "4"}, "sliding_window must be a positive integer"),
        ({"sliding_window": 0}, "sliding_window must be a positive integer"),
        ({"layer_types": ["sliding_attention"]}, "layer_types must be a list of 3"),
    ):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(ProbeError, match=match):
            import_model(tmp_path / "q")


def exported(model, source_type, tmp_path):
    out = tmp_path / "exported"
    export_hf(model, source_type, out)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    return ref, import_model(out).model


@pytest.mark.parametrize("case", ["mistral-8", "qwen2-4-from-layer-1"])
def test_export_round_trips_the_window(case, tmp_path):
    kind, kw, _, _ = CASES[case]
    tiny(kind, **kw).save_pretrained(tmp_path / case)
    model = import_model(tmp_path / case).model
    ref, back = exported(model, kind, tmp_path)
    assert ref.config.model_type == kind
    assert logits_gap(model, ref) < TOL
    assert back.cfg == model.cfg


@pytest.mark.parametrize(("qkv_bias", "layers"), [(False, (1,)), (True, None)])
def test_export_writes_any_window_pattern_as_qwen2(qkv_bias, layers, tmp_path):
    """A window on some layers (no q/k/v biases: written as zeros), or on every layer of a
    model with q/k/v biases, is a Qwen2 with layer_types."""
    kind, kw = ("qwen2", {}) if qkv_bias else ("mistral", dict(sliding_window=None))
    tiny(kind, **kw).save_pretrained(tmp_path / "src")
    source = import_model(tmp_path / "src").model
    cfg = dataclasses.replace(source.cfg, sliding_window=5, window_layers=layers)
    model = Transformer(cfg).eval()
    model.load_state_dict(source.state_dict())
    ref, back = exported(model, kind, tmp_path)
    assert ref.config.model_type == "qwen2"
    assert logits_gap(model, ref) < TOL
    assert (back.cfg.sliding_window, back.cfg.window_layers) == (5, layers)
    assert logits_gap(back, ref) < TOL
