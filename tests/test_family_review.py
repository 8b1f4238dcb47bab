"""Cases a review of the issue-24 families found wrong, each against transformers 5.24 itself:
config.json keys that change the function transformers computes (a tied flag over a file that
holds a different output layer; `rope_scaling` beside `rope_parameters`), and bad values that
must be one line and exit 2. Tiny random models of tests/family_models.py, edited here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from family_models import VOCAB, save_tiny
from safetensors.torch import load_file, save_file

from probe.interop.importer import import_model
from probe.rope import RopeScaling

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {k: save_tiny(k, root) for k in ("qwen3", "phi3", "olmo2", "gpt_neox", "gemma",
                                            "gemma2")}  # fmt: skip


def edited(base: Path, where: Path, change=None, weights=None) -> Path:
    """A copy of `base` with `change(config dict)` and `weights(state dict)` applied."""
    shutil.copytree(base, where)
    if change is not None:
        doc = json.loads((where / "config.json").read_text())
        change(doc)
        (where / "config.json").write_text(json.dumps(doc))
    if weights is not None:
        state = load_file(where / "model.safetensors")
        weights(state)
        save_file(state, where / "model.safetensors", metadata={"format": "pt"})
    return where


def one_line(args: list[str], capsys) -> str:
    capsys.readouterr()
    code = exit_code(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    return lines[0]


def max_diff(path: Path) -> float:
    """Largest logit difference of probe's import of `path` and transformers' load of it."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    model = import_model(path).model
    tokens = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (model(tokens) - ref(tokens).logits).abs().max().item()


EMBED = {"gpt_neox": ("gpt_neox.embed_in.weight", "embed_out.weight")}


@pytest.mark.parametrize("kind", ["qwen3", "phi3", "olmo2", "gpt_neox", "gemma2"])
def test_a_tied_flag_over_a_different_output_layer_is_refused(kind, tiny_dirs, tmp_path, capsys):
    """transformers 5 ties embedding and output layer only when the file's are equal; probe tied
    them and dropped the file's head (logits off by ~0.5 on every family)."""
    embed, head = EMBED.get(kind, ("model.embed_tokens.weight", "lm_head.weight"))

    def add_head(state):
        state[head] = state[embed] + 0.5

    path = edited(tiny_dirs[kind], tmp_path / kind,
                  lambda c: c.update(tie_word_embeddings=True), add_head)  # fmt: skip
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path))
    out, table = ref.get_output_embeddings().weight, ref.get_input_embeddings().weight
    assert not torch.equal(out, table)  # transformers computes with both, untied
    line = one_line(["import", str(path), "--out", str(tmp_path / "out")], capsys)
    assert str(path) in line and "tie_word_embeddings" in line and head in line, line
    # the remedy the line names works: untied, probe equals transformers
    untied = edited(path, tmp_path / "untied", lambda c: c.update(tie_word_embeddings=False))
    assert max_diff(untied) < 1e-4


def test_a_tied_file_whose_head_equals_the_embedding_still_imports(tiny_dirs, tmp_path):
    def same_head(state):
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()

    path = edited(tiny_dirs["gemma2"], tmp_path / "g", weights=same_head)
    assert import_model(path).model.cfg.tie_embeddings and max_diff(path) < 1e-4


def _scaling_beside(section: dict):
    """A default `rope_scaling` without a base beside `rope_parameters` of base 50 (and
    `section`'s other keys): transformers reads rope_scaling alone, so the base is 10000."""

    def change(c):
        params = c.get("rope_parameters") or {}
        c["rope_parameters"] = {**params, "rope_type": "default", "rope_theta": 50.0}
        c["rope_scaling"] = section

    return change


@pytest.mark.parametrize("kind", ["qwen3", "phi3", "gemma", "gemma2"])
def test_rope_scaling_replaces_rope_parameters_as_transformers_reads_it(kind, tiny_dirs,
                                                                        tmp_path):  # fmt: skip
    path = edited(tiny_dirs[kind], tmp_path / kind, _scaling_beside({"rope_type": "default"}))
    assert import_model(path).model.cfg.rope_base == 10000.0
    assert max_diff(path) < 1e-4


def test_gemma2_linear_rope_scaling_beside_default_rope_parameters(tiny_dirs, tmp_path):
    scaling = {"rope_type": "linear", "factor": 4.0}
    path = edited(tiny_dirs["gemma2"], tmp_path / "g", _scaling_beside(scaling))
    assert import_model(path).model.cfg.rope_scaling == RopeScaling("linear", 4.0)
    assert max_diff(path) < 1e-4


def test_phi3_zero_key_value_heads_is_one_line(tiny_dirs, tmp_path, capsys):
    path = edited(tiny_dirs["phi3"], tmp_path / "p", lambda c: c.update(num_key_value_heads=0))
    line = one_line(["import", str(path), "--out", str(tmp_path / "out")], capsys)
    assert "config.json: num_key_value_heads must be a positive integer" in line, line


QKV = "gpt_neox.layers.0.attention.query_key_value."


@pytest.mark.parametrize(
    "name, cut",
    [("weight", lambda t: t[:-8]), ("weight", lambda t: t.flatten()),
     ("bias", lambda t: t[:-3]), ("bias", lambda t: t[None])],
)  # fmt: skip
def test_a_neox_fused_qkv_of_the_wrong_shape_is_one_line(name, cut, tiny_dirs, tmp_path, capsys):
    """It was a RuntimeError from `view` (or, for a [1, rows] bias, silently reshaped)."""

    def damage(state):
        state[QKV + name] = cut(state[QKV + name]).contiguous()

    path = edited(tiny_dirs["gpt_neox"], tmp_path / "n", weights=damage)
    line = one_line(["import", str(path), "--out", str(tmp_path / "out")], capsys)
    assert f"'{QKV}{name}' has shape" in line and "config.json implies (96" in line, line


def test_exporting_a_pruned_neox_says_its_removed_heads_are_zeros(tiny_dirs, tmp_path, capsys):
    """GPT-NeoX's config has no head size: the export is at the unpruned size (transformers
    loads 4 heads a layer), which the CLI says, with why; an unpruned export says nothing of it."""
    ckpt, pruned = tmp_path / "ckpt", tmp_path / "pruned"
    assert exit_code(["import", str(tiny_dirs["gpt_neox"]), "--out", str(ckpt)]) == 0
    prune = ["prune", str(ckpt), "--no-timing", "--max-tokens", "16", "--batch-size", "4"]
    assert exit_code([*prune, "--out", str(pruned), "--fraction", "0.5", "--uniform"]) == 0
    capsys.readouterr()
    assert exit_code(["export", str(pruned), "--out", str(tmp_path / "hf")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert ref.config.num_attention_heads == 4  # 2 of them zero in each of the 2 layers
    assert "4 removed heads are written as zeros at the unpruned size" in out, out
    assert "no head size" in out
    assert exit_code(["export", str(ckpt), "--out", str(tmp_path / "full")]) == 0
    assert "removed head" not in capsys.readouterr().out
