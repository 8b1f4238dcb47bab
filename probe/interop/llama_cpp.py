"""GGUF files run in llama.cpp itself (llama-cpp-python, `scripts/llama-cpp.sh`), side by side:
the key/value cache llama.cpp reports, prompt processing and greedy decoding tokens/s.

    table = measure_gguf({"original": a, "pruned": b}, prompt_ids, new=64, repeats=3)
    table = export_and_measure({"original": m, "pruned": p}, tokenizer, prompt_ids)  # models
    speed_summary(table)    # per model: medians, and ratios to "original"

Every model is loaded once; a repeat runs each model in turn (the order alternating), a fresh
prompt then `new` greedy tokens one at a time. llama.cpp runs with flash attention (a file whose
layers hold different key/value widths is then not padded to the widest) and a float16 cache of
`ctx` cells. Rows: model, repeat, metric (prompt_tokens_per_s, decode_tokens_per_s,
kv_cache_mib, file_mib), value.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from probe.errors import ProbeError


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python's version, or None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(llama_cpp.__version__)


def load(path: Path, ctx: int, threads: int):
    """A llama.cpp model and its key/value cache in MiB, read off llama.cpp's own log."""
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ProbeError("llama-cpp-python is not installed: bash scripts/llama-cpp.sh builds "
                         "it from its PyPI source release.") from None  # fmt: skip
    with tempfile.TemporaryFile(mode="w+") as log:
        with _c_stderr(log):
            llm = Llama(model_path=str(path), n_ctx=ctx, n_threads=threads, flash_attn=True,
                        verbose=True)  # fmt: skip
        log.seek(0)
        found = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB", log.read())
    return llm, float(found.group(1)) if found else float("nan")


def _run(llm, prompt: list[int], new: int) -> tuple[float, float]:
    """(prompt tokens/s, decoding tokens/s) of one fresh prompt and `new` greedy tokens."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for made, _ in enumerate(llm.generate(prompt, temp=0.0, top_k=1, reset=False), start=1):
        if made == new:
            break
    return len(prompt) / prefill, new / (time.perf_counter() - start)


def measure_gguf(files: Mapping[str, Path], prompt: list[int], new: int = 64, repeats: int = 3,
                 threads: int = 1, ctx: int = 2048) -> pd.DataFrame:  # fmt: skip
    """The rows of the module docstring for every file of `files` (name -> GGUF path)."""
    if len(prompt) + new > ctx:
        raise ProbeError(f"a prompt of {len(prompt)} tokens and {new} new ones do not fit in a "
                         f"cache of {ctx} cells.")  # fmt: skip
    llms, rows = {}, []
    for name, path in files.items():
        llms[name], kv = load(path, ctx, threads)
        rows += [{"model": name, "repeat": 0, "metric": "kv_cache_mib", "value": kv},
                 {"model": name, "repeat": 0, "metric": "file_mib",
                  "value": Path(path).stat().st_size / 2**20}]  # fmt: skip
    for i in range(repeats):  # alternate, so a busy moment hits every model
        order = list(llms) if i % 2 == 0 else list(llms)[::-1]
        for name in order:
            prefill, decode = _run(llms[name], prompt, new)
            rows += [{"model": name, "repeat": i, "metric": "prompt_tokens_per_s",
                      "value": prefill},
                     {"model": name, "repeat": i, "metric": "decode_tokens_per_s",
                      "value": decode}]  # fmt: skip
    _close(llms.values())
    return pd.DataFrame(rows)


def _close(llms) -> None:
    """Free the models, out of the terminal's sight: loaded verbose (for the cache size),
    llama.cpp logs its buffers again as it frees them."""
    with open(os.devnull, "w") as null, _c_stderr(null):
        for llm in llms:
            llm.close()


@contextmanager
def _c_stderr(into) -> Iterator[None]:
    """The process's C-level stderr (file descriptor 2, where llama.cpp logs) sent to the open
    file `into` for the block, then restored."""
    saved = os.dup(2)
    os.dup2(into.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def export_and_measure(models: Mapping, tokenizer, prompt: list[int], dtype=None, new: int = 64,
                       repeats: int = 3, threads: int = 1, ctx: int = 2048,
                       progress=None) -> pd.DataFrame:  # fmt: skip
    """Each model (name -> imported Llama-family `Transformer`) exported as GGUF in `dtype`
    (`probe.interop.gguf_write`) into a temporary folder and measured (`measure_gguf`); the rows
    carry each file's architecture and its real query and key/value head counts."""
    from probe.interop.gguf_write import export_gguf

    with tempfile.TemporaryDirectory() as tmp:
        exports = {}
        for i, (name, model) in enumerate(models.items()):
            exports[name] = export_gguf(model, "llama", tokenizer, Path(tmp) / f"{i}.gguf", dtype)
            if progress is not None:
                progress(i + 1, len(models) + 1)
        table = measure_gguf({n: e.path for n, e in exports.items()}, prompt, new, repeats,
                             threads, ctx)  # fmt: skip
    table["arch"] = table.model.map({n: e.arch for n, e in exports.items()})
    table["heads"] = table.model.map({n: sum(e.heads) - e.padded_heads for n, e in exports.items()})
    table["kv_heads"] = table.model.map({n: sum(e.kv_heads) for n, e in exports.items()})
    if progress is not None:
        progress(len(models) + 1, len(models) + 1)
    return table


def speed_summary(speed: pd.DataFrame) -> pd.DataFrame:
    """Per model of an `export_and_measure` table: architecture, heads, file and cache MiB,
    median tokens/s, and ratios to the model called "original"."""
    med = speed.groupby(["model", "metric"], sort=False).value.median().unstack("metric")
    first = speed.drop_duplicates("model").set_index("model")
    out = pd.DataFrame({
        "arch": first.arch, "heads": first.heads, "kv_heads": first.kv_heads,
        "file_mib": med.file_mib, "kv_cache_mib": med.kv_cache_mib,
        "prompt_tok_s": med.prompt_tokens_per_s, "decode_tok_s": med.decode_tokens_per_s,
    })  # fmt: skip
    base = out.loc["original"]
    out["decode_vs_original"] = out.decode_tok_s / base.decode_tok_s
    out["prompt_vs_original"] = out.prompt_tok_s / base.prompt_tok_s
    out["kv_cache_vs_original"] = out.kv_cache_mib / base.kv_cache_mib
    return out.reset_index()
