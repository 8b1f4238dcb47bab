"""OLMo-2 and GPT-NeoX (Pythia) compute what transformers computes: tiny random models built in
transformers here (norms and biases moved off 0 and 1), imported, pruned, exported and loaded
back into transformers, and walked through the CLI."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from precision import HALF, assert_matches_reference

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.interop.export import export_hf
from probe.interop.importer import import_model
from probe.pruning.heads import masked, prune_heads

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB = 99
KINDS = ["neox", "neox-seq", "olmo2"]


def tiny(kind: str):
    """A small random transformers model: Pythia-like (parallel residual, rotary on half of each
    head, base 500), sequential NeoX without attention biases and with gelu_new, and OLMo-2 with
    grouped-query attention (6 query heads, 2 key/value groups)."""
    torch.manual_seed(0)
    if kind == "neox":
        cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=80,
                                         rotary_pct=0.5, rotary_emb_base=500)  # fmt: skip
        return transformers.GPTNeoXForCausalLM(cfg)
    if kind == "neox-seq":
        cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=80,
                                         use_parallel_residual=False, attention_bias=False,
                                         hidden_act="gelu_new")  # fmt: skip
        return transformers.GPTNeoXForCausalLM(cfg)
    cfg = transformers.Olmo2Config(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2,
                                   intermediate_size=80, rope_theta=500.0, eos_token_id=2,
                                   pad_token_id=1)  # fmt: skip
    return transformers.Olmo2ForCausalLM(cfg)


def saved(kind: str, root: Path, sharp: bool = False) -> tuple[torch.nn.Module, Path]:
    """`tiny(kind)` with biases and norm gains away from 0 and 1 (`sharp`: matrices of std 0.2,
    logits of a few units, for half precision), saved under `root`."""
    model = tiny(kind).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if sharp and p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith("bias") or "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(root / kind)
    return model, root / kind


def inputs(batch: int = 3, seq: int = 11):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=g)
    keep = torch.ones(batch, seq, dtype=torch.bool)
    keep[1, 7:] = False  # one padded row
    return tokens, keep


def logits(model, tokens, keep=None):
    with torch.no_grad():
        return model.logits(model.features(tokens, key_mask=keep))


@pytest.mark.parametrize("kind", KINDS)
def test_float32_logits_match_transformers_with_padding(kind, tmp_path):
    ref, path = saved(kind, tmp_path)
    imported = import_model(path)
    cfg = imported.model.cfg
    if kind == "neox":  # the fused query_key_value and the partial rotary were read as written
        assert cfg.parallel_residual and cfg.rotary_dims == 6 and cfg.rope_base == 500
    if kind == "olmo2":
        assert cfg.qk_norm_whole and cfg.norm == "branch" and cfg.kv_heads == 2
    tokens, keep = inputs()
    with torch.no_grad():
        want = ref(tokens, attention_mask=keep.long()).logits
    assert (logits(imported.model, tokens, keep) - want)[keep].abs().max() < TOL


class Weights:
    needs_weights = True

    def record(self, call) -> None:
        pass


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_matches_transformers_in_the_same_dtype(kind, dtype, tmp_path):
    """probe cast to bf16/fp16 against transformers loaded in that dtype, on the fused and the
    explicit attention path (bound: `precision.assert_matches_reference`)."""
    _, path = saved(kind, tmp_path, sharp=True)
    tokens, keep = inputs()

    def reference(dtype):
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        with torch.no_grad():
            return ref(tokens, attention_mask=keep.long()).logits

    theirs32, theirs = reference(torch.float32), reference(dtype)
    model = import_model(path).model.to(dtype)
    for observer in (None, Weights()):
        with model.observe(observer) if observer else contextlib.nullcontext():
            ours = logits(model, tokens, keep)
        assert ours.dtype == dtype
        assert_matches_reference(ours, theirs, theirs32, keep)


# (layer, head) removed: ragged, one whole key/value group of OLMo-2 (heads 0-2 of layer 0),
# and uniform (the same count of heads, and of groups, in every layer)
PRUNES = {
    "neox": {"ragged": [(0, 1), (1, 0), (1, 3)], "uniform": [(0, 2), (1, 0)]},
    "neox-seq": {"ragged": [(0, 0), (0, 1), (0, 2)], "uniform": [(0, 3), (1, 1)]},
    "olmo2": {
        "group": [(0, 0), (0, 1), (0, 2), (1, 4)],
        "uniform": [(0, 0), (0, 5), (1, 2), (1, 3)],
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_pruned_equals_gated(kind, tmp_path):
    """Physically pruning equals zeroing those heads' gates; an OLMo-2 site keeps every q and k
    row (its QK-norm spans the heads) and drops the v rows of a group no head reads."""
    _, path = saved(kind, tmp_path)
    model = import_model(path).model
    tokens, keep = inputs()
    for remove in PRUNES[kind].values():
        with masked(model, remove):
            want = logits(model, tokens, keep)
        pruned = prune_heads(model, remove)
        assert (logits(pruned, tokens, keep) - want)[keep].abs().max() < 1e-5
        attn = pruned.blocks[0].attn
        n_kept = len(attn.kept_heads)
        assert attn.o.weight.shape[1] == n_kept * attn.d_head
        if kind == "olmo2":
            assert attn.q.weight.shape[0] == 6 * attn.d_head  # every query row kept
            assert attn.v.weight.shape[0] == len(attn.site.kept_groups) * attn.d_head
    if kind == "olmo2":
        site = prune_heads(model, PRUNES["olmo2"]["group"]).cfg.sites()[0]
        assert site.kept_heads == (3, 4, 5) and site.kept_groups == (1,)


def load_exported(model, model_type: str, out: Path):
    export_hf(model, model_type, out)
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    return transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()


@pytest.mark.parametrize("kind", KINDS)
def test_export_unpruned_loads_in_transformers_with_equal_logits(kind, tmp_path):
    _, path = saved(kind, tmp_path)
    imported = import_model(path)
    ref = load_exported(imported.model, imported.source["model_type"], tmp_path / "out")
    tokens, keep = inputs()
    with torch.no_grad():
        want = ref(tokens, attention_mask=keep.long()).logits
    assert (logits(imported.model, tokens, keep) - want)[keep].abs().max() < TOL


MODEL_TYPES = {"neox": "gpt_neox", "neox-seq": "gpt_neox", "olmo2": "olmo2"}


@pytest.mark.parametrize("kind", KINDS)
def test_pruned_exports_with_its_removed_heads_zero(kind, tmp_path):
    """GPT-NeoX's head size is hidden_size / num_attention_heads and OLMo-2's QK-norm spans
    every head, so a pruned model (uniform or ragged) is written at its full head count with the
    removed heads zero: the same logits."""
    _, path = saved(kind, tmp_path)
    model = import_model(path).model
    tokens, keep = inputs()
    for name, remove in PRUNES[kind].items():
        pruned = prune_heads(model, remove)
        ref = load_exported(pruned, MODEL_TYPES[kind], tmp_path / name)
        assert ref.config.num_attention_heads == pruned.cfg.n_head
        with torch.no_grad():
            want = ref(tokens, attention_mask=keep.long()).logits
        assert (logits(pruned, tokens, keep) - want)[keep].abs().max() < TOL
        back = import_model(tmp_path / name).model  # read back: zero heads, the same function
        assert (logits(back, tokens, keep) - want)[keep].abs().max() < TOL


def edited(path: Path, tmp_path: Path, name: str, **changes) -> Path:
    """A copy of the saved model `path` whose config.json has `changes` (None: key removed)."""
    out = tmp_path / name
    out.mkdir()
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    return out


def test_old_pythia_configs_and_weight_names_import(tmp_path):
    """Pythia's config.json has rotary_pct and rotary_emb_base at the top level, no
    rope_parameters; its output layer is `embed_out` (transformers 5 also reads `lm_head`)."""
    from safetensors.torch import load_file, save_file

    ref, path = saved("neox", tmp_path)
    old = edited(path, tmp_path, "old", rope_parameters=None, rotary_pct=0.5,
                 rotary_emb_base=500)  # fmt: skip
    weights = load_file(str(old / "model.safetensors"))
    weights["lm_head.weight"] = weights.pop("embed_out.weight")
    save_file(weights, str(old / "model.safetensors"), metadata={"format": "pt"})
    tokens, keep = inputs()
    with torch.no_grad():
        want = ref(tokens, attention_mask=keep.long()).logits
    assert (logits(import_model(old).model, tokens, keep) - want)[keep].abs().max() < TOL


@pytest.mark.parametrize(
    ("kind", "changes", "words"),
    [
        (
            "neox",
            {"rope_parameters": {"rope_type": "linear", "factor": True}},
            "rope_parameters: rotary scaling 'factor' must be a finite number > 0, got True",
        ),
        (
            "neox",
            {"rope_scaling": {"type": "dynamic"}},
            "rope_scaling: rotary scaling kind 'dynamic' needs 'factor'",
        ),
        (
            "neox",
            {"rope_parameters": {"rope_theta": 500, "partial_rotary_factor": 0.3}},
            "partial_rotary_factor = 0.3 rotates 3",
        ),
        ("neox", {"hidden_act": "silu"}, "hidden_act"),
        ("neox", {"head_dim": 6}, "head_dim"),
        (
            "neox",
            {"tie_word_embeddings": True, "attn_logit_softcapping": 30.0},
            "attn_logit_softcapping",
        ),
        (
            "olmo2",
            {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 1.0}},
            "'beta_fast' \\(1.0\\) must be greater than 'beta_slow'",
        ),
        ("olmo2", {"attention_bias": True}, "attention_bias"),
        ("olmo2", {"hidden_act": "gelu"}, "hidden_act"),
        ("olmo2", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ],
)
def test_what_probe_cannot_compute_is_one_line_naming_the_key(kind, changes, words, tmp_path):
    _, path = saved(kind, tmp_path)
    with pytest.raises(ProbeError, match=words) as err:
        import_model(edited(path, tmp_path, "bad", **changes))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["neox", "olmo2"])
def test_the_cli_walks_every_command(kind, tmp_path, capsys):
    from test_cli_imported import word_tokenizer

    _, path = saved(kind, tmp_path)
    word_tokenizer(False).save(str(path / "tokenizer.json"))
    ckpt, text = tmp_path / "ckpt", ["--max-tokens", "16", "--batch-size", "4"]
    assert exit_code(["import", str(path), "--out", str(ckpt)]) == 0
    assert exit_code(["info", str(ckpt)]) == 0
    assert kind.replace("neox", "gpt_neox") in capsys.readouterr().out
    assert exit_code(["inspect", str(ckpt), "--out", str(tmp_path / "inspect"), "--lengths",
                      "8,16", "--batch-size", "4", "--batches", "1"]) == 0  # fmt: skip
    assert "blocks.1.attn" in (tmp_path / "inspect" / "attention_stats.csv").read_text()
    imp = tmp_path / "imp"
    assert exit_code(["importance", str(ckpt), "--out", str(imp), "--method", "ablation",
                      *text]) == 0  # fmt: skip
    pruned = {}
    for unit in ("uniform", "group"):
        pruned[unit] = tmp_path / unit
        how = ["--uniform"] if unit == "uniform" else ["--unit", "group"]
        assert exit_code(["prune", str(ckpt), "--out", str(pruned[unit]), "--fraction", "0.5",
                          *how, "--no-timing", *text]) == 0  # fmt: skip
        sites = load_checkpoint(pruned[unit]).model_cfg.sites()
        if unit == "uniform":  # NeoX: 2 of each layer's 4 heads; OLMo-2: 1 of each group's 3
            assert {len(s.kept_heads) for s in sites} == {2}
            assert all(len(s.kept_groups) == s.n_kv_head for s in sites) or kind == "neox"
        else:  # half of the key/value groups, whole (NeoX: a group is one head)
            assert sum(len(s.kept_groups) for s in sites) == sum(s.n_kv_head for s in sites) // 2
    assert exit_code(["view", str(ckpt), "--out", str(tmp_path / "view.html")]) == 0
    assert (tmp_path / "view.html").stat().st_size > 10_000
    capsys.readouterr()
    assert exit_code(["export", str(pruned["uniform"]), "--out", str(tmp_path / "hf")]) == 0
    # written at the unpruned size, and the user is told why
    assert "note:" in capsys.readouterr().out
    loaded = load_checkpoint(pruned["uniform"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    tokens, _ = inputs()
    with torch.no_grad():
        assert (ref(tokens).logits - loaded.model(tokens)).abs().max() < TOL


def test_olmo2_rotates_in_float32_and_rounds_once():
    """transformers' OLMo-2 rotates bf16 queries with float32 cos and sin and rounds the result
    once; probe's OLMo-2 does the same (`rope_float32`): equal but for the last bit of a few
    elements (the two compute the frequencies by different float32 formulas), where rounding
    cos and sin to bf16 first, as Llama does, differs on a third of them."""
    from transformers.models.olmo2 import modeling_olmo2

    from probe.config import ModelConfig
    from probe.model.positional import Rotary

    hf = transformers.Olmo2Config(hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                                  vocab_size=VOCAB, rope_theta=500.0, eos_token_id=2)  # fmt: skip
    x = torch.randn(2, 4, 300, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    positions = torch.arange(300).expand(2, 300)
    cos, sin = modeling_olmo2.Olmo2RotaryEmbedding(hf)(x, positions)
    want, _ = modeling_olmo2.apply_rotary_pos_emb(x, x, cos, sin)
    differ = {}
    for float32 in (True, False):
        cfg = ModelConfig(d_model=64, n_head=4, pe="rope", rope_base=500.0, rope_float32=float32)
        got = Rotary(cfg)(x, positions)
        assert got.dtype == torch.bfloat16
        differ[float32] = float((got != want).float().mean())
    assert differ[True] < 0.01 and differ[False] > 0.1, differ
