"""Qwen3 and Phi-3 against transformers: tiny random models built here, imported (float32 within
1e-4, half precision within transformers' own rounding), pruned (equal to the gated model),
exported back (transformers loads them with equal logits), walked through the CLI, and the
config features probe cannot compute refused in one line.

Qwen3: RMSNorm on each head's q and k, head_dim 12 where d_model / n_head is 8 (and the default
128 when config.json has none), q/k/v biases, sliding windows of 4 keys on layers 1 and 2.
Phi-3: fused qkv_proj and gate_up_proj, rotary on half of each head, a window of 5 keys on every
layer. Inputs are 13 tokens, longer than every window, with one padded row."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from precision import HALF, assert_matches_reference
from safetensors import safe_open
from test_cli_imported import word_tokenizer

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.interop.export import export_hf
from probe.interop.importer import import_model
from probe.pruning.heads import masked, prune_heads

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB = 99
VARIANTS = ["qwen3", "qwen3-plain", "phi3", "phi3-full"]


def tiny(variant: str):
    """A small random transformers model of `variant`."""
    torch.manual_seed(0)
    shape = dict(vocab_size=VOCAB, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
                 pad_token_id=None)  # fmt: skip
    if variant == "qwen3":  # windows on layers 1 and 2 (max_window_layers 1), biases, tied
        cfg = transformers.Qwen3Config(**shape, hidden_size=32, num_hidden_layers=3,
                                       num_attention_heads=4, head_dim=12, intermediate_size=48,
                                       use_sliding_window=True, sliding_window=4,
                                       max_window_layers=1, attention_bias=True,
                                       tie_word_embeddings=True, rope_theta=500.0)  # fmt: skip
    elif variant == "qwen3-plain":  # head_dim left to its default (128), untied
        cfg = transformers.Qwen3Config(**shape, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=48)  # fmt: skip
    elif variant == "phi3":  # partial rotary, a window on every layer
        cfg = transformers.Phi3Config(**shape, hidden_size=48, num_hidden_layers=2,
                                      num_attention_heads=6, intermediate_size=40,
                                      partial_rotary_factor=0.5, sliding_window=5)  # fmt: skip
    else:  # full rotary, no window, tied
        cfg = transformers.Phi3Config(**shape, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=40,
                                      rope_theta=500.0, tie_word_embeddings=True)  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(cfg)


def saved(variant: str, root: Path, sharp: bool = False) -> Path:
    """`variant` with norms and biases away from 1 and 0 (`sharp`: weights of std 0.2 as well,
    logits of a few units, for half precision), o_proj's biases zero (probe has none there),
    saved; Qwen3's plain variant without head_dim in its config.json."""
    model = tiny(variant).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if sharp and p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("o_proj.bias"):
                p.zero_()
    path = root / variant
    model.save_pretrained(path)
    if variant == "qwen3-plain":
        edit(path, lambda c: c.pop("head_dim"))
    return path


def edit(path: Path, change) -> None:
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


def inputs(batch: int = 3, seq: int = 13):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=g)
    keep = torch.ones(batch, seq, dtype=torch.bool)
    keep[1, 9:] = False  # one padded row
    return tokens, keep


def logits_of(ref, tokens, keep) -> torch.Tensor:
    with torch.no_grad():
        return ref(tokens, attention_mask=keep.long()).logits


def ours(model, tokens, keep) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model.features(tokens, key_mask=keep))


# d_head, q/k/v biases, sliding_window, window_layers, rope_fraction as transformers reads them
EXPECTED = {"qwen3": (12, True, 4, (1, 2), 1.0), "qwen3-plain": (128, False, None, None, 1.0),
            "phi3": (8, False, 5, None, 0.5), "phi3-full": (8, False, None, None, 1.0)}  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_logits_match_transformers(variant, tmp_path):
    path = saved(variant, tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    imported = import_model(path)
    cfg = imported.model.cfg
    assert (cfg.d_head, bool(cfg.qkv_bias), cfg.sliding_window, cfg.window_layers,
            cfg.rope_fraction) == EXPECTED[variant]  # fmt: skip
    assert cfg.qk_norm == variant.startswith("qwen3")
    assert ref.model.layers[0].self_attn.head_dim == cfg.d_head  # as transformers reads it
    tokens, keep = inputs()
    assert (ours(imported.model, tokens, keep) - logits_of(ref, tokens, keep))[
        keep
    ].abs().max() < TOL


class Weights:
    needs_weights = True  # the explicit attention path

    def record(self, call) -> None:
        pass


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("variant", ["qwen3", "phi3"])
def test_half_precision_matches_transformers_in_the_same_dtype(variant, dtype, tmp_path):
    """As test_interop_parity's half-precision test: the gap to transformers in the same dtype
    is within twice transformers' own rounding (fused and explicit path, a padded row)."""
    path = saved(variant, tmp_path, sharp=True)
    tokens, keep = inputs()

    def reference(d):
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=d).eval()
        return logits_of(ref, tokens, keep)

    theirs32, theirs = reference(torch.float32), reference(dtype)
    model = import_model(path).model.to(dtype)
    for observer in (None, Weights()):
        with model.observe(observer) if observer else contextlib.nullcontext():
            got = ours(model, tokens, keep)
        assert got.dtype == dtype
        assert_matches_reference(got, theirs, theirs32, keep)


# (removed (layer, head) pairs, the key/value groups then left in layer 0): Qwen3 has 2 groups
# of 2 heads in 3 layers, Phi-3 2 groups of 3 heads in 2 layers
PRUNES = {"qwen3": ([(0, 0), (0, 1), (1, 3), (2, 2)], (1,)),
          "phi3": ([(0, 0), (0, 4), (1, 1), (1, 2), (1, 3)], (0, 1))}  # fmt: skip


@pytest.mark.parametrize("variant", ["qwen3", "phi3"])
def test_pruned_equals_gated_and_ragged_prunes_are_not_exported(variant, tmp_path):
    model = import_model(saved(variant, tmp_path)).model
    remove, groups = PRUNES[variant]
    tokens, keep = inputs()
    with masked(model, remove):
        want = ours(model, tokens, keep)
    pruned = prune_heads(model, remove)
    assert pruned.cfg.sites()[0].kept_groups == groups
    assert (ours(pruned, tokens, keep) - want)[keep].abs().max() < 1e-5
    with pytest.raises(ProbeError, match="--uniform") as err:
        export_hf(pruned, variant, tmp_path / "ragged")
    assert "\n" not in str(err.value) and not (tmp_path / "ragged").exists()


def uniform(variant: str, n_layer: int) -> list[tuple[int, int]]:
    """One query head of each key/value group (uniform), or all of group 0 (by group)."""
    per_layer = {"qwen3": [0, 3], "phi3": [1, 5], "qwen3-group": [0, 1], "phi3-group": [0, 1, 2]}
    return [(layer, h) for layer in range(n_layer) for h in per_layer[variant]]


@pytest.mark.parametrize("variant", [*VARIANTS, "qwen3-group", "phi3-group"])
def test_export_loads_in_transformers_with_equal_logits(variant, tmp_path):
    """Unpruned (every variant), and pruned the same way in every layer: a head of each group,
    or a whole group; the export is read back by probe as the same model."""
    kind = variant.removesuffix("-group")
    imported = import_model(saved(kind, tmp_path))
    model = imported.model
    if kind != variant or kind in ("qwen3", "phi3"):
        model = prune_heads(model, uniform(variant, model.cfg.n_layer))
    out = tmp_path / "exported"
    export_hf(model, imported.source["model_type"], out)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    site = model.cfg.sites()[0]
    assert ref.config.model_type == kind.removesuffix("-plain").removesuffix("-full")
    assert ref.config.num_attention_heads == len(site.kept_heads)
    assert ref.config.num_key_value_heads == len(site.kept_groups)
    tokens, keep = inputs()
    want = ours(model, tokens, keep)
    assert (logits_of(ref, tokens, keep) - want)[keep].abs().max() < TOL
    again = import_model(out).model
    assert (ours(again, tokens, keep) - want)[keep].abs().max() < TOL
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = " ".join(f.keys())
    assert ("qkv_proj" in names, "gate_up_proj" in names) == (kind.startswith("phi3"),) * 2
    assert "q_norm" in names and "k_norm" in names if kind.startswith("qwen3") else True


REFUSED = [
    ("qwen3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                   "beta_fastt": 32}}, "rope_parameters: rotary scaling has key "
     "'beta_fastt', which probe does not know. Did you mean 'beta_fast'"),
    ("qwen3", {"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
    ("qwen3", {"attn_logit_softcapping": 30.0}, "attn_logit_softcapping"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                  "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}},
     "'short_factor' has 3 entries; 4 rotated dims need 2"),
    ("phi3", {"rope_parameters": None, "rope_scaling": {"type": "su"}}, "needs 'short_factor'"),
    ("phi3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
     "rope_type = 'linear': Phi-3 computes rope_type 'default' or 'longrope'"),
    ("phi3", {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.375}},
     "partial_rotary_factor = 0.375: it rotates 3 of"),
    ("phi3", {"hidden_act": "gelu_new"}, "hidden_act"),
    ("phi3", {"query_pre_attn_scalar": 16}, "query_pre_attn_scalar"),
    # what the Llama family computes without these keys is still refused with them
    ("qwen3", {"model_type": "qwen2", "use_qk_norm": True}, "use_qk_norm = True"),
    ("phi3", {"model_type": "llama"}, "partial_rotary_factor = 0.5"),
]  # fmt: skip


@pytest.mark.parametrize(("variant", "change", "match"), REFUSED)
def test_features_probe_cannot_compute_are_refused_in_one_line(variant, change, match, tmp_path):
    path = saved(variant, tmp_path)
    edit(path, lambda c: c.update(change))
    with pytest.raises(ProbeError) as err:
        import_model(path)
    assert match in str(err.value) and "\n" not in str(err.value)


def test_a_bias_on_qwen3s_o_proj_is_refused(tmp_path):
    model = tiny("qwen3")
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.bias.fill_(0.5)
    model.save_pretrained(tmp_path / "q")
    with pytest.raises(ProbeError, match=r"non-zero bias on o_proj \(model\.layers\.1\."):
        import_model(tmp_path / "q")


TEXT = ["--max-tokens", "16", "--batch-size", "4", "--no-timing"]


@pytest.mark.parametrize("variant", ["qwen3", "phi3"])
def test_the_cli_walks_a_tiny_model(variant, tmp_path, capsys):
    path = saved(variant, tmp_path)
    word_tokenizer(False).save(str(path / "tokenizer.json"))
    ckpt = tmp_path / "ckpt"
    assert exit_code(["import", str(path), "--out", str(ckpt)]) == 0
    assert exit_code(["info", str(ckpt)]) == 0
    assert "key/value groups kept" in capsys.readouterr().out
    inspect = tmp_path / "inspect"
    args = ["--lengths", "8,16", "--batch-size", "4", "--batches", "1"]
    assert exit_code(["inspect", str(ckpt), "--out", str(inspect), *args]) == 0
    assert "blocks.1.attn" in (inspect / "attention_stats.csv").read_text()
    imp = tmp_path / "imp"
    assert exit_code(["importance", str(ckpt), "--out", str(imp), "--method", "ablation",
                      *TEXT[:4]]) == 0  # fmt: skip
    for unit, pruned in (("head", tmp_path / "uniform"), ("group", tmp_path / "group")):
        assert exit_code(["prune", str(ckpt), "--out", str(pruned), "--fraction", "0.5",
                          "--unit", unit, "--uniform", *TEXT]) == 0  # fmt: skip
        loaded = load_checkpoint(pruned)
        sites = loaded.model_cfg.sites()
        shapes = {(len(s.kept_heads), len(s.kept_groups)) for s in sites}
        assert len(shapes) == 1  # one shape in every layer
        heads, groups = shapes.pop()
        n_head, n_kv = loaded.model_cfg.n_head, loaded.model_cfg.kv_heads
        if unit == "head":  # some heads of every group
            assert groups == n_kv and n_kv <= heads < n_head and heads % n_kv == 0
        else:  # half the groups, whole
            assert groups == n_kv // 2 and heads == groups * (n_head // n_kv)
        hf = tmp_path / f"hf-{unit}"
        assert exit_code(["export", str(pruned), "--out", str(hf)]) == 0
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf)).eval()
        tokens, keep = inputs()
        diff = logits_of(ref, tokens, keep) - ours(loaded.model, tokens, keep)
        assert diff[keep].abs().max() < TOL
    page = tmp_path / "view.html"
    assert exit_code(["view", str(ckpt), "--out", str(page)]) == 0
    assert page.stat().st_size > 10_000
