"""Gemma, Gemma 2 and Gemma 3 (text) imported from transformers compute transformers' logits
(float32 within 1e-4, padded rows and sequences past the sliding window included; bf16 and
fp16 within `precision.assert_matches_reference`), prune exactly (a pruned model equals the
gated one), export back to a directory transformers loads with the same logits, and refuse in
one line what probe cannot compute."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch
from precision import HALF, assert_matches_reference

from probe.errors import ProbeError
from probe.interop.export import export_hf
from probe.interop.importer import import_model
from probe.model import Transformer
from probe.pruning.heads import masked, prune_heads
from probe.rope import RopeScaling

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB, SEQ, WINDOW = 99, 11, 4  # sequences longer than the window
KINDS = ["gemma", "gemma2", "gemma3_text"]
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=64,
)  # fmt: skip  (head_dim != 48 / 6)
MIXED = ["sliding_attention", "full_attention", "sliding_attention"]  # local, global, local


def build(kind: str, **kw):
    """A small random transformers model of `kind`, weights far from the tiny init (attention
    far from uniform, so soft-capping and the window matter), norms away from 0."""
    torch.manual_seed(0)
    if kind == "gemma":
        model = transformers.GemmaForCausalLM(
            transformers.GemmaConfig(**SHAPE | {"num_hidden_layers": 2} | kw)
        )
    elif kind == "gemma2":
        cfg = dict(num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=20,
                   attn_logit_softcapping=3.0, final_logit_softcapping=15.0)  # fmt: skip
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**SHAPE | cfg | kw))
    else:
        rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}  # fmt: skip
        cfg = dict(num_hidden_layers=3, sliding_window=WINDOW, layer_types=MIXED,
                   query_pre_attn_scalar=20, rope_parameters=rope,
                   final_logit_softcapping=15.0)  # fmt: skip
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**SHAPE | cfg | kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3 if "proj" in name else 1.0)
            elif "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def saved(kind: str, tmp_path, **kw):
    model = build(kind, **kw)
    path = tmp_path / kind
    model.save_pretrained(path)
    return model, path


def inputs(batch: int = 3):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    keep = torch.ones(batch, SEQ, dtype=torch.bool)
    keep[1, 8:] = False  # one padded row
    return tokens, keep


def ours(model: Transformer, tokens, keep=None) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model.features(tokens, key_mask=keep))


def theirs(ref, tokens, keep=None) -> torch.Tensor:
    with torch.no_grad():
        return ref(tokens, attention_mask=None if keep is None else keep.long()).logits


def gap(a: torch.Tensor, b: torch.Tensor, keep=None) -> float:
    return float((a - b)[keep].abs().max()) if keep is not None else float((a - b).abs().max())


@pytest.mark.parametrize("kind", KINDS)
def test_float32_logits_match_past_the_window_with_padding(kind, tmp_path):
    ref, path = saved(kind, tmp_path)
    imported = import_model(path)
    model = imported.model
    assert imported.source["model_type"] == kind
    tokens, keep = inputs()
    want = theirs(ref, tokens, keep)
    assert gap(ours(model, tokens, keep), want, keep) < TOL
    assert gap(ours(model, tokens), theirs(ref, tokens)) < TOL  # unpadded
    if kind == "gemma":
        return
    # each feature shows: a window one key wider, no soft-capping, another query scale differ
    cfg = model.cfg
    variants = [dataclasses.replace(cfg, sliding_window=WINDOW + 1),
                dataclasses.replace(cfg, scale_dim=None),
                dataclasses.replace(cfg, final_softcap=None)]  # fmt: skip
    if kind == "gemma2":
        variants.append(dataclasses.replace(cfg, attn_softcap=None))
    else:
        variants += [dataclasses.replace(cfg, rope_scaling=RopeScaling()),
                     dataclasses.replace(cfg, rope_local_base=None)]  # fmt: skip
    for variant in variants:
        other = Transformer(variant).eval()
        other.load_state_dict(model.state_dict())
        assert gap(ours(other, tokens, keep), want, keep) > 1e-3, variant


def test_the_sandwich_norms_map_to_their_places(tmp_path):
    """Gemma 2's four norms per layer: input_layernorm before attention, post_attention after
    it, pre_feedforward before the FFN, post_feedforward after it (swapping two breaks it)."""
    ref, path = saved("gemma2", tmp_path)
    model = import_model(path).model
    layer = ref.model.layers[1]
    block = model.blocks[1]
    for theirs_norm, probe_norm in (
        (layer.input_layernorm, block.ln_attn),
        (layer.post_attention_layernorm, block.ln_attn_out),
        (layer.pre_feedforward_layernorm, block.ln_ffn),
        (layer.post_feedforward_layernorm, block.ln_ffn_out),
    ):
        assert torch.equal(theirs_norm.weight, probe_norm.weight)
    with torch.no_grad():
        block.ln_attn_out.weight, block.ln_ffn.weight = (
            block.ln_ffn.weight,
            block.ln_attn_out.weight,
        )
    tokens, _ = inputs()
    assert gap(ours(model, tokens), theirs(ref, tokens)) > 1e-3


def test_gemma3_old_style_config_and_ignored_attention_softcap(tmp_path):
    """A Gemma 3 config.json in the older keys (rope_theta, rope_local_base_freq, rope_scaling,
    sliding_window_pattern) reads as transformers reads it; attn_logit_softcapping, which
    transformers 5.24 never applies to Gemma 3, changes nothing in either."""
    ref, path = saved("gemma3_text", tmp_path, num_hidden_layers=4, layer_types=MIXED[:2] * 2)
    config = json.loads((path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        del config[key]
    config |= {"rope_theta": 700.0, "rope_local_base_freq": 30.0, "sliding_window_pattern": 2,
               "rope_scaling": {"rope_type": "linear", "factor": 3.0},
               "attn_logit_softcapping": 0.5}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    assert ref.config.layer_types == MIXED[:2] * 2
    model = import_model(path).model
    assert model.cfg.window_layers == (0, 2) and model.cfg.rope_local_base == 30.0
    assert (model.cfg.rope_base, model.cfg.rope_scaling) == (700.0, RopeScaling("linear", 3.0))
    tokens, keep = inputs()
    assert gap(ours(model, tokens, keep), theirs(ref, tokens, keep), keep) < TOL


class Weights:
    needs_weights = True

    def record(self, call) -> None:
        pass


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_matches_transformers_in_the_same_dtype(kind, dtype, tmp_path):
    """probe in bf16/fp16 against transformers loaded in that dtype, padded rows included, on
    the fused and the explicit path (bound: `precision.assert_matches_reference`)."""
    _, path = saved(kind, tmp_path)
    tokens, keep = inputs()

    def reference(dtype):
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        return theirs(ref, tokens, keep)

    theirs32, same = reference(torch.float32), reference(dtype)
    model = import_model(path).model.to(dtype)
    for observer in (None, Weights()):
        with model.observe(observer) if observer else contextlib.nullcontext():
            logits = ours(model, tokens, keep)
        assert logits.dtype == dtype
        assert_matches_reference(logits, same, theirs32, keep)


@pytest.mark.parametrize("kind", KINDS)
def test_pruned_equals_gated_by_head_and_by_group(kind, tmp_path):
    _, path = saved(kind, tmp_path)
    model = import_model(path).model
    tokens, keep = inputs()
    n_layer = model.cfg.n_layer
    by_head = [(0, 1), (0, 4), (n_layer - 1, 0)]
    by_group = [(1, h) for h in range(3)]  # layer 1's first key/value group, whole
    for remove in (by_head, by_group):
        with masked(model, remove):
            want = ours(model, tokens, keep)
        pruned = prune_heads(model, remove)
        assert gap(ours(pruned, tokens, keep), want, keep) < 1e-5
    assert pruned.cfg.sites()[1].kept_groups == (1,)
    assert pruned.blocks[1].attn.k.weight.shape == (16, 48)


@pytest.mark.parametrize("kind", KINDS)
def test_export_unpruned_and_uniformly_pruned_loads_in_transformers(kind, tmp_path):
    ref, path = saved(kind, tmp_path)
    model = import_model(path).model
    tokens, keep = inputs()
    out = tmp_path / "out"
    export_hf(model, kind, out)
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert json.loads((out / "config.json").read_text())["model_type"] == kind
    assert gap(theirs(back, tokens, keep), theirs(ref, tokens, keep), keep) < TOL
    assert import_model(out).model.cfg == model.cfg  # and reads back as the same config
    uniform = [(i, h) for i in range(model.cfg.n_layer) for h in (0, 3)]  # one per group
    pruned = prune_heads(model, uniform)
    export_hf(pruned, kind, tmp_path / "pruned")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "pruned")).eval()
    assert back.config.num_attention_heads == 4 and back.config.num_key_value_heads == 2
    assert gap(theirs(back, tokens, keep), ours(pruned, tokens, keep), keep) < TOL
    ragged = prune_heads(model, [(0, 0)])
    with pytest.raises(ProbeError, match=r"--uniform") as err:
        export_hf(ragged, kind, tmp_path / "ragged")
    assert "\n" not in str(err.value)


def test_gemma2_export_refuses_a_head_count_transformers_rejects(tmp_path):
    """transformers' Gemma 2 and 3 configs require hidden_size to be a multiple of the head
    count: 48 with 5 heads is refused in one line (Gemma's has no such rule)."""
    _, path = saved("gemma2", tmp_path, num_key_value_heads=6)
    model = import_model(path).model
    pruned = prune_heads(model, [(i, 0) for i in range(model.cfg.n_layer)])
    with pytest.raises(ProbeError, match=r"keeps 5 heads.*multiple of num_attention_heads"):
        export_hf(pruned, "gemma2", tmp_path / "out")


def edited(path, **changes):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))
    return path


@pytest.mark.parametrize(
    ("kind", "changes", "words"),
    [
        ("gemma2", {"rope_parameters": {"rope_type": "yarn", "factor": -2.0}},
         "rope_parameters: rotary scaling 'factor' must be a finite number > 0, got -2.0"),
        ("gemma", {"rope_parameters": {"rope_type": "dynamik", "factor": 2.0}},
         "Did you mean 'dynamic'"),
        ("gemma3_text", {"rope_parameters": {
            "full_attention": {"rope_type": "default"},
            "sliding_attention": {"rope_type": "longrope", "short_factor": [1.0],
                                  "long_factor": [1.0], "factor": 2.0}}},
         "'short_factor' has 1 entries"),
        ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional"),
        ("gemma2", {"attention_bias": True}, "attention_bias = True"),
        ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation = 'gelu'"),
        ("gemma2", {"sliding_window": None}, "sliding_window must be a positive integer"),
        ("gemma2", {"layer_types": ["full_attention"]}, "layer_types must be a list of 3"),
    ],
)  # fmt: skip
def test_what_probe_cannot_compute_is_one_line(kind, changes, words, tmp_path):
    _, path = saved(kind, tmp_path)
    with pytest.raises(ProbeError, match=words) as err:
        import_model(edited(path, **changes))
    assert "\n" not in str(err.value)


def test_multimodal_gemma3_imports_its_text_model(tmp_path):
    """A Gemma 3 with a vision tower (model_type gemma3): probe imports the language model
    (text_config, model.language_model.*) and computes what transformers computes on text."""
    text = build("gemma3_text").config.to_dict()
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    torch.manual_seed(0)
    ref = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "language_model" in name and p.dim() >= 2:
                p.normal_(0.0, 0.3)
            elif "language_model" in name and "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    ref.save_pretrained(tmp_path / "mm")
    imported = import_model(tmp_path / "mm")
    assert imported.model.cfg.qk_norm and imported.model.cfg.window_layers == (0, 2)
    tokens, keep = inputs()
    assert gap(ours(imported.model, tokens, keep), theirs(ref, tokens, keep), keep) < TOL
    export_hf(imported.model, imported.source["model_type"], tmp_path / "text")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "text")).eval()
    assert back.config.model_type == "gemma3_text"
    assert gap(theirs(back, tokens, keep), theirs(ref, tokens, keep), keep) < TOL


@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_walks_a_gemma(kind, tmp_path, capsys):
    """import (with a tokenizer), info, inspect, importance, prune (uniform; by group), export
    and view on a tiny model of each Gemma; the exported uniform prune computes in transformers
    what probe's pruned checkpoint computes."""
    from cli_run import exit_code
    from test_cli_imported import word_tokenizer

    from probe.checkpoint import load_checkpoint

    _, path = saved(kind, tmp_path, vocab_size=99)
    word_tokenizer(False).save(str(path / "tokenizer.json"))
    ckpt, text = tmp_path / "ckpt", ["--max-tokens", "16", "--batch-size", "4"]
    assert exit_code(["import", str(path), "--out", str(ckpt)]) == 0
    assert exit_code(["info", str(ckpt)]) == 0
    assert "key/value groups kept" in capsys.readouterr().out
    inspect = ["inspect", str(ckpt), "--out", str(tmp_path / "inspect"), "--lengths", "8,16",
               "--batch-size", "4", "--batches", "1", "--needles", "0"]  # fmt: skip
    assert exit_code(inspect) == 0
    stats = (tmp_path / "inspect" / "attention_stats.csv").read_text()
    assert f"blocks.{load_checkpoint(ckpt).model_cfg.n_layer - 1}.attn" in stats
    imp = ["importance", str(ckpt), "--out", str(tmp_path / "imp"), "--method", "ablation"]
    assert exit_code([*imp, *text]) == 0
    prune = ["prune", str(ckpt), "--no-timing", *text, "--out"]
    assert exit_code([*prune, str(tmp_path / "uniform"), "--fraction", "0.34", "--uniform"]) == 0
    groups = tmp_path / "groups"
    assert exit_code([*prune, str(groups), "--fraction", "0.5", "--unit", "group"]) == 0
    sites = load_checkpoint(groups).model_cfg.sites()
    assert sum(len(s.kept_groups) for s in sites) == len(sites)  # half of 2 groups per layer
    hf = tmp_path / "hf"
    assert exit_code(["export", str(tmp_path / "uniform"), "--out", str(hf)]) == 0
    loaded = load_checkpoint(tmp_path / "uniform")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf)).eval()
    assert ref.config.model_type == kind and ref.config.num_attention_heads == 4
    tokens, keep = inputs()
    assert gap(theirs(ref, tokens, keep), ours(loaded.model, tokens, keep), keep) < TOL
    page = tmp_path / "view.html"
    assert exit_code(["view", str(ckpt), "--out", str(page)]) == 0
    assert page.stat().st_size > 10_000
