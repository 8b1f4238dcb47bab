"""Benchmark: SmolLM2-135M and three copies with a third of its query heads removed, exported by
`probe export --format gguf` and run in llama.cpp (llama-cpp-python), side by side in one process,
repeats alternating: the file's size, llama.cpp's own report of its key/value cache, prompt
processing and decoding tokens/s, and each pruned model's ratio to the original.

The pruned models are made here as the smollm2-heal study makes them (`probe.heal.prune`: Fisher
information of the head mask on the shipped text; ragged with mask tuning, whole key/value groups,
one head from every group), unhealed (healing changes weights, not speed). Files are --dtype
(default float16; quantizing is llama.cpp's job). llama.cpp runs with flash attention (so a file
whose layers hold different key/value widths is not padded to the widest), --ctx cells of
key/value cache in float16, --threads threads; a repeat is a fresh prompt of --prompt tokens
(prompt tokens/s) then --new greedy tokens one at a time (decoding tokens/s); the median of
--repeats. Needs scripts/llama-cpp.sh.

    .venv/bin/python benchmarks/bench_gguf.py [--threads 1] [--repeats 3] [--dtype float16]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch

from probe.data.text import read_documents, stream_rows, text_splits
from probe.heal.prune import METHODS, prune_for_healing
from probe.interop.bundled import bundled_path
from probe.interop.gguf_write import export_gguf
from probe.interop.importer import import_model
from probe.runtime import resolve_dtype


def loaded(path: Path, ctx: int, threads: int):
    """A llama.cpp model and its key/value cache in MiB, read off llama.cpp's own log."""
    from llama_cpp import Llama

    with tempfile.TemporaryFile(mode="w+") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # llama.cpp logs to the C stderr
        try:
            llm = Llama(model_path=str(path), n_ctx=ctx, n_threads=threads, flash_attn=True,
                        verbose=True)  # fmt: skip
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        found = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB", log.read())
    return llm, float(found.group(1)) if found else float("nan")


def run_once(llm, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    """(prompt tokens/s, decoding tokens/s, the greedy continuation)."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    out = []
    start = time.perf_counter()
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=False):
        out.append(token)
        if len(out) == new:
            break
    decode = time.perf_counter() - start
    return len(prompt) / prefill, new / decode, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import llama_cpp

    source = bundled_path("smollm2")
    imported = import_model(source)
    model, tokenizer = imported.model.eval(), imported.tokenizer
    docs = read_documents(None)
    sets, _ = text_splits(docs, tokenizer, "causal-lm", 128, 8, 2, 1)
    prompt = stream_rows(docs, tokenizer, args.prompt, 1)[0][0].tolist()
    dtype = resolve_dtype(args.dtype)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"original": export_gguf(model, "llama", tokenizer, Path(tmp) / "o.gguf", dtype)}
        for method in METHODS:
            pruned, _ = prune_for_healing(model, sets[0], 1 / 3, method)
            files[method] = export_gguf(pruned, "llama", tokenizer, Path(tmp) / f"{method}.gguf",
                                        dtype)  # fmt: skip
            del pruned
        llms = {}
        for name, export in files.items():
            llms[name], kv = loaded(export.path, args.ctx, args.threads)
            rows[name] = {"export": export, "kv": kv, "prompt": [], "decode": []}
        for i in range(args.repeats):  # alternate, so a busy moment hits every model
            order = list(llms) if i % 2 == 0 else list(llms)[::-1]
            for name in order:
                prefill, decode, _ = run_once(llms[name], prompt, args.new)
                rows[name]["prompt"].append(prefill)
                rows[name]["decode"].append(decode)
    print(f"llama-cpp-python {llama_cpp.__version__}, {args.threads} thread(s), {args.dtype} "
          f"weights, float16 key/value cache of {args.ctx} cells, flash attention, prompt "
          f"{args.prompt} + {args.new} greedy tokens, median of {args.repeats}\n")  # fmt: skip
    print("| model | arch | query / kv heads | file MiB | KV cache MiB | prompt tok/s | "
          "decode tok/s | decode vs original | KV cache vs original |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    base = rows["original"]
    for name, r in rows.items():
        e = r["export"]
        decode = statistics.median(r["decode"])
        print(f"| {name} | {e.arch} | {sum(e.heads) - e.padded_heads} / {sum(e.kv_heads)} | "
              f"{e.bytes / 2**20:,.1f} | {r['kv']:.2f} | {statistics.median(r['prompt']):.0f} | "
              f"{decode:.1f} | {decode / statistics.median(base['decode']):.2f}x | "
              f"{r['kv'] / base['kv']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
