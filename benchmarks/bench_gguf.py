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
--repeats (`probe.interop.llama_cpp.export_and_measure`, as the smollm2-heal study's llama-cpp
step). Needs scripts/llama-cpp.sh.

    .venv/bin/python benchmarks/bench_gguf.py [--threads 1] [--repeats 3] [--dtype float16]
"""

from __future__ import annotations

import argparse
import os

import torch

from probe.data.text import read_documents, stream_rows, text_splits
from probe.heal.prune import METHODS, prune_for_healing
from probe.interop.bundled import bundled_path
from probe.interop.importer import import_model
from probe.interop.llama_cpp import export_and_measure, llama_cpp_version, speed_summary
from probe.runtime import resolve_dtype


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
    imported = import_model(bundled_path("smollm2"))
    model, tokenizer = imported.model.eval(), imported.tokenizer
    docs = read_documents(None)
    sets, _ = text_splits(docs, tokenizer, "causal-lm", 128, 8, 2, 1)
    prompt = stream_rows(docs, tokenizer, args.prompt, 1)[0][0].tolist()
    models = {"original": model}
    models |= {m: prune_for_healing(model, sets[0], 1 / 3, m)[0] for m in METHODS}
    table = export_and_measure(models, tokenizer, prompt, resolve_dtype(args.dtype), args.new,
                               args.repeats, args.threads, args.ctx)  # fmt: skip
    print(f"llama-cpp-python {llama_cpp_version()}, {args.threads} thread(s), {args.dtype} "
          f"weights, float16 key/value cache of {args.ctx} cells, flash attention, prompt "
          f"{args.prompt} + {args.new} greedy tokens, median of {args.repeats}\n")  # fmt: skip
    print("| model | arch | query / kv heads | file MiB | KV cache MiB | prompt tok/s | "
          "decode tok/s | decode vs original | KV cache vs original |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in speed_summary(table).itertuples():
        print(f"| {r.model} | {r.arch} | {r.heads} / {r.kv_heads} | {r.file_mib:,.1f} | "
              f"{r.kv_cache_mib:.2f} | {r.prompt_tok_s:.0f} | {r.decode_tok_s:.1f} | "
              f"{r.decode_vs_original:.2f}x | {r.kv_cache_vs_original:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
