"""SmolLM3 and OLMo-3 against transformers: tiny random models shaped like the real ones, built
and saved by transformers here, imported (float32 logits within 1e-4, eager attention; bf16 and
fp16 within transformers' own rounding), exported back (transformers loads the export with equal
logits and reads the same rotary sections, `no_rope_layers` and `layer_types`), pruned, and
their bad configs refused in one line; a model type that only looks like a supported one is
not told to relabel itself.

SmolLM3-3B: no rotary on every 4th layer, a flat rotary section (the long variant: YaRN with an
original context of 32, a window of 16 keys on the layers without rotary, q/k/v biases).
OLMo-3-7B: windows of 16 keys on 3 of 4 layers, full attention every 4th, one rotary section per
layer type (the long variant: YaRN on the full layers with the 7B's parameters, the original
context shrunk from 8192 to 32). Inputs are 128 tokens: 4x the original context, 8x the window,
with one padded row. Each test of a feature also checks that probe without it would miss
transformers by far, so a feature read wrongly cannot pass unseen."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from precision import HALF, assert_matches_reference

from probe.errors import ProbeError
from probe.interop.export import export_hf
from probe.interop.families import family
from probe.interop.importer import import_model
from probe.model import Transformer
from probe.pruning.heads import prune_heads
from probe.rope import UNSCALED, RopeScaling

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB = 99
SEQ = 128  # 4x the YaRN variants' original context (32), 8x the window (16)
VARIANTS = ["smollm3", "smollm3-long", "olmo3", "olmo3-long"]
# the 7B's YaRN section on the full layers, its original context shrunk from 8192
OLMO3_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
              "attention_factor": 1.2079, "beta_fast": 32, "beta_slow": 1,
              "rope_theta": 500000.0}  # fmt: skip


def tiny_config(variant: str):
    shape = dict(vocab_size=VOCAB, num_hidden_layers=4, max_position_embeddings=256,
                 bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip
    if variant == "smollm3":  # the 3B's layout: tied, GQA, layer 3 without rotary
        return transformers.SmolLM3Config(**shape, hidden_size=64, num_attention_heads=8,
                                          num_key_value_heads=4, intermediate_size=96,
                                          rope_parameters={"rope_theta": 5000.0})  # fmt: skip
    if variant == "smollm3-long":  # YaRN, windows on the layers without rotary, biases, untied
        return transformers.SmolLM3Config(**shape, hidden_size=32, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=48,
                                          no_rope_layers=[0, 1, 1, 0], use_sliding_window=True,
                                          sliding_window=16, attention_bias=True,
                                          tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 32,
                                                           "rope_theta": 5000.0})  # fmt: skip
    rope = None  # the 7B's default: base 500000 on both layer types
    if variant == "olmo3-long":
        rope = {"full_attention": OLMO3_YARN,
                "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}  # fmt: skip
    return transformers.Olmo3Config(**shape, hidden_size=48, num_attention_heads=6,
                                    num_key_value_heads=2, intermediate_size=80, sliding_window=16,
                                    rope_parameters=rope)  # fmt: skip


def saved(variant: str, root: Path) -> Path:
    """`variant` with norms and biases moved off 1 and 0 (o_proj's biases zero: probe has none
    there) and q and k large enough that the positions move the scores, saved by transformers."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(variant)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):  # scores that positions move
                p.normal_(0.0, 0.2)
            if name.endswith("o_proj.bias"):
                p.zero_()
    model.save_pretrained(root / variant)
    return root / variant


def edited(path: Path, root: Path, change) -> Path:
    """A copy of the saved model at `path` whose config.json `change` edits in place."""
    out = root / f"{path.name}-edited"
    out.mkdir()
    config = json.loads((path / "config.json").read_text())
    change(config)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    return out


def reference(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), attn_implementation="eager"
    ).eval()


def inputs(batch: int = 3, seq: int = SEQ):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=g)
    keep = torch.ones(batch, seq, dtype=torch.bool)
    keep[1, 100:] = False  # one padded row
    return tokens, keep


def theirs(ref, tokens, keep) -> torch.Tensor:
    with torch.no_grad():
        return ref(tokens, attention_mask=keep.long()).logits


def ours(model, tokens, keep) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model.features(tokens, key_mask=keep))


def gap(model, want, tokens, keep) -> float:
    return float((ours(model, tokens, keep) - want)[keep].abs().max())


def rebuilt(model, **changes) -> Transformer:
    """`model`'s weights in a model whose config has `changes`."""
    other = Transformer(replace(model.cfg, **changes)).eval()
    other.load_state_dict(model.state_dict())
    return other


def test_smollm3_reads_its_layers_as_transformers_builds_them(tmp_path):
    """The layers without rotary and the windowed ones are those transformers' modules use."""
    for variant in ("smollm3", "smollm3-long"):
        path = saved(variant, tmp_path)
        ref, cfg = reference(path), import_model(path).model.cfg
        layers = ref.model.layers
        assert cfg.nope_layers == tuple(i for i, x in enumerate(layers) if not x.self_attn.use_rope)
        slides = tuple(i for i, t in enumerate(ref.config.layer_types) if t == "sliding_attention")
        assert tuple(i for i in range(cfg.n_layer) if cfg.window(i)) == slides
        assert cfg.tie_embeddings == ref.config.tie_word_embeddings
    assert cfg.nope_layers == (0, 3) and cfg.window_layers == (0, 3) and cfg.qkv_bias
    assert (
        cfg.rope_scaling.kind == "yarn" and cfg.rope_scaling.original_max_position_embeddings == 32
    )


def test_olmo3_reads_its_layers_and_rotary_sections_as_transformers_builds_them(tmp_path):
    path = saved("olmo3-long", tmp_path)
    ref, cfg = reference(path), import_model(path).model.cfg
    rotary = ref.model.rotary_emb
    assert cfg.window_layers == (0, 1, 2) and cfg.sliding_window == 16
    assert (cfg.rope_base, cfg.rope_local_base) == (500000.0, 500000.0)
    yarn = {k: v for k, v in OLMO3_YARN.items() if k not in ("rope_type", "rope_theta")}
    assert cfg.rope_scaling == RopeScaling("yarn", max_position_embeddings=256, **yarn)
    assert cfg.rope_local_scaling == UNSCALED
    assert rotary.rope_type == {"full_attention": "yarn", "sliding_attention": "default"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_logits_match_transformers_past_the_window_and_the_context(variant, tmp_path):
    """Within 1e-4 of transformers at 128 tokens; probe without the layers without rotary, the
    window, or the scaling misses by more than 1e-2 (each feature is exercised)."""
    path = saved(variant, tmp_path)
    model = import_model(path).model
    tokens, keep = inputs()
    want = theirs(reference(path), tokens, keep)
    assert gap(model, want, tokens, keep) < TOL
    cfg = model.cfg
    without = {}
    if cfg.sliding_window:
        without["window"] = {"sliding_window": None, "window_layers": None, "rope_local_base": None}
    if cfg.nope_layers:
        without["nope"] = {"nope_layers": None}
    if not cfg.rope_scaling.plain:
        without["scaling"] = {"rope_scaling": UNSCALED}
    for changes in without.values():
        assert gap(rebuilt(model, **changes), want, tokens, keep) > 1e-2


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_loads_in_transformers_and_round_trips(variant, tmp_path):
    """transformers reads the export's rotary sections, no_rope_layers and layer_types as it
    read the source's and computes the same logits; probe reads the export as the same model."""
    path = saved(variant, tmp_path)
    model = import_model(path).model
    out = tmp_path / "exported"
    export_hf(model, variant.removesuffix("-long"), out)
    source, export = reference(path), reference(out)
    keys = ["rope_parameters", "layer_types", "sliding_window", "no_rope_layers", "model_type",
            "tie_word_embeddings", "attention_bias", "num_key_value_heads"]  # fmt: skip
    for key in keys:
        assert getattr(export.config, key, None) == getattr(source.config, key, None), key
    tokens, keep = inputs()
    want = theirs(source, tokens, keep)
    assert float((theirs(export, tokens, keep) - want)[keep].abs().max()) < TOL
    again = import_model(out).model
    assert again.cfg == model.cfg
    assert gap(again, want, tokens, keep) < TOL


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("variant", ["smollm3-long", "olmo3-long"])
def test_half_precision_matches_transformers_in_the_same_dtype(variant, dtype, tmp_path):
    """probe cast to bf16/fp16 against transformers loaded in that dtype, at 64 tokens (past the
    window and the original context; bound: `precision.assert_matches_reference`)."""
    path = saved(variant, tmp_path)
    tokens, keep = inputs(seq=64)

    def reference_in(d):
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=d, attn_implementation="eager"
        ).eval()
        return theirs(ref, tokens, keep)

    got = ours(import_model(path).model.to(dtype), tokens, keep)
    assert got.dtype == dtype
    assert_matches_reference(got, reference_in(dtype), reference_in(torch.float32), keep)


def test_an_old_style_olmo3_config_reads_as_transformers_reads_it(tmp_path):
    """Top-level rope_theta and rope_scaling (the Hub's files) reach only the full layers'
    section; the sliding layers keep the default base 500000, as in transformers."""
    path = saved("olmo3", tmp_path)
    scaling = {k: v for k, v in OLMO3_YARN.items() if k != "rope_theta"}

    def old(config):
        config.pop("rope_parameters")
        config.update(rope_theta=20000.0, rope_scaling=scaling)

    old_path = edited(path, tmp_path, old)
    ref, cfg = reference(old_path), import_model(old_path).model.cfg
    assert ref.config.rope_parameters["sliding_attention"]["rope_theta"] == cfg.rope_local_base
    assert (cfg.rope_base, cfg.rope_local_base, cfg.rope_scaling.kind) == (
        20000.0,
        500000.0,
        "yarn",
    )
    tokens, keep = inputs()
    assert gap(import_model(old_path).model, theirs(ref, tokens, keep), tokens, keep) < TOL


@pytest.mark.parametrize("variant", ["smollm3", "olmo3"])
def test_absent_keys_take_the_config_class_defaults(variant, tmp_path):
    """config.json without the rotary, the layer types and (SmolLM3) no_rope_layers,
    the tie flag and the key/value head count: probe fills in what transformers fills in."""
    keys = ["rope_parameters", "layer_types", "no_rope_layers", "tie_word_embeddings",
            "num_key_value_heads", "sliding_window", "use_sliding_window"]  # fmt: skip
    if variant == "olmo3":  # 2 of 6 heads: its default (as many as the query heads) differs
        keys.remove("num_key_value_heads")
    path = edited(saved(variant, tmp_path), tmp_path, lambda c: [c.pop(k, None) for k in keys])
    model = import_model(path).model
    assert model.cfg.rope_base == {"smollm3": 2_000_000.0, "olmo3": 500_000.0}[variant]
    tokens, keep = inputs()
    assert gap(model, theirs(reference(path), tokens, keep), tokens, keep) < TOL


def test_pruned_smollm3_exports_uniform_and_refuses_ragged(tmp_path):
    model = import_model(saved("smollm3-long", tmp_path)).model
    tokens, keep = inputs()
    pruned = prune_heads(model, [(layer, h) for layer in range(4) for h in (0, 3)])
    export_hf(pruned, "smollm3", tmp_path / "uniform")
    ref = reference(tmp_path / "uniform")
    assert ref.config.num_attention_heads == 2 and ref.config.no_rope_layers == [0, 1, 1, 0]
    assert gap(pruned, theirs(ref, tokens, keep), tokens, keep) < TOL
    ragged = prune_heads(model, [(0, 0), (2, 1), (2, 3)])
    with pytest.raises(ProbeError, match=r"Hugging Face SmolLM3: .*--uniform") as err:
        export_hf(ragged, "smollm3", tmp_path / "ragged")
    assert "\n" not in str(err.value) and not (tmp_path / "ragged").exists()


def test_pruned_olmo3_exports_at_full_head_count_with_removed_heads_zero(tmp_path):
    model = import_model(saved("olmo3-long", tmp_path)).model
    tokens, keep = inputs()
    pruned = prune_heads(model, [(0, 0), (0, 1), (0, 2), (3, 4)])  # ragged: a whole group
    export_hf(pruned, "olmo3", tmp_path / "out")
    ref = reference(tmp_path / "out")
    assert ref.config.num_attention_heads == 6 and ref.config.layer_types[3] == "full_attention"
    assert gap(pruned, theirs(ref, tokens, keep), tokens, keep) < TOL
    assert "OLMo-3's QK-norm" in family({"model_type": "olmo3"}, "x").PRUNED_EXPORT


BAD = [
    ("smollm3", {"no_rope_layers": [1, 1, 0]}, "no_rope_layers must be a list of 4 flags"),
    ("smollm3", {"no_rope_layers": [1, 1, 2, 1]}, "no_rope_layers must be a list of 4 flags"),
    ("smollm3", {"layer_types": ["full_attention"] * 3 + ["local"]},
     "layer_types must be a list of 4 of full_attention, sliding_attention, got"),
    ("smollm3", {"layer_types": ["sliding_attention"] * 4, "sliding_window": None},
     "sliding_window must be a positive integer (layer_types has sliding layers)"),
    ("smollm3", {"mlp_bias": True}, "mlp_bias = True"),
    ("smollm3", {"use_sliding_window": "yes"}, "use_sliding_window must be true or false"),
    ("olmo3", {"layer_types": ["full_attention", "chunked_attention"] * 2}, "layer_types must be"),
    ("olmo3", {"layer_types": ["full_attention"] * 5}, "layer_types must be a list of 4"),
    ("olmo3", {"sliding_window": None}, "sliding_window must be a positive integer"),
    ("olmo3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters must be a mapping of full_attention and sliding_attention"),
    ("olmo3", {"rope_parameters": {"full_attention": {"rope_type": "yarn"}, "global": {}}},
     "rope_parameters.global = {}"),
    ("olmo3", {"attention_bias": True}, "attention_bias = True: biases on q, k, v and o are not "
     "implemented in probe's OLMo-3"),
]  # fmt: skip


@pytest.mark.parametrize(("variant", "change", "words"), BAD)
def test_bad_configs_are_one_line_naming_the_key(variant, change, words, tmp_path):
    path = edited(saved(variant, tmp_path), tmp_path, lambda c: c.update(change))
    with pytest.raises(ProbeError) as err:
        import_model(path)
    assert words in str(err.value) and "\n" not in str(err.value)


TYPOS = {"lama": "llama", "qwen_2": "qwen2", "gpt-neox": "gpt_neox", "GPT_NeoX": "gpt_neox",
         "olmo_3": "olmo3", "smolllm3": "smollm3", "qewn3": "qwen3",
         "mistrel": "mistral", "mistal": "mistral", "gemma3_txt": "gemma3_text"}  # fmt: skip
# other models' names that look like supported ones: never told to relabel
LOOKALIKES = ["olmo4", "smollm4", "qwen4", "gemma4", "llama4", "gemma3n", "olmo", "qwen",
              "llava", "bart", "phi3_v", "qwen2_vl", "gpt_neo", "gemma3n_text",
              "smolvlm"]  # fmt: skip


@pytest.mark.parametrize(("typo", "meant"), TYPOS.items())
def test_a_mistyped_model_type_is_told_the_supported_one(typo, meant):
    with pytest.raises(ProbeError, match=f"is not supported. Did you mean '{meant}'\\?"):
        family({"model_type": typo}, "m")


@pytest.mark.parametrize("name", LOOKALIKES)
def test_a_model_type_that_only_looks_alike_is_not_relabelled(name):
    with pytest.raises(ProbeError) as err:
        family({"model_type": name}, "m")
    assert "Did you mean" not in str(err.value) and "\n" not in str(err.value)
    assert "olmo3" in str(err.value) and "smollm3" in str(err.value)  # the supported list


def test_known_lookalikes_name_what_probe_lacks():
    for name, feature in [("gemma3n", "AltUp"), ("olmo", "clipped q/k/v"), ("llama4", "chunked"),
                          ("qwen3_next", "DeltaNet")]:  # fmt: skip
        with pytest.raises(ProbeError, match=f"{name}' is not supported: it needs .*{feature}"):
            family({"model_type": name}, "m")
    assert family({"model_type": "olmo3"}, "m").MODEL_TYPES == ("olmo3",)
    assert family({"model_type": "smollm3"}, "m").MODEL_TYPES == ("smollm3",)
