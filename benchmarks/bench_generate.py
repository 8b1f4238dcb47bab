"""Benchmark: greedy decoding tokens/s of probe's cached generation (`probe.measure.generate`)
against transformers' `generate` on the same model, side by side in one process, repeats
alternating, and the same continuation (asserted token for token).

Models: SmolLM2-135M (the bundled Q4_1 GGUF, dequantized: probe imports it, transformers loads the
same file into LlamaForCausalLM, as bench_fidelity.py does) and a tiny random Llama (2 layers,
4 heads in 2 key/value groups, d_model 64, vocabulary 512), both float32. The prompt is the
first PROMPT tokens of the shipped text (SmolLM2's tokenizer; the tiny model takes the ids
modulo its vocabulary), batch 1. transformers runs with its EOS switched off, so both decode
exactly --new tokens. Time: the whole call (prefill + decoding), the median over --repeats;
the ratio is probe's time / transformers'. Target: <= 1.2x.

    .venv/bin/python benchmarks/bench_generate.py [--new 64] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from probe.data.text import read_documents, stream_rows
from probe.interop.bundled import bundled_path
from probe.interop.importer import import_model
from probe.measure.generate import generate

PROMPT = 32  # prompt tokens


def tiny_llama(folder: Path) -> Path:
    import transformers as tf

    torch.manual_seed(0)
    shape = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, **shape)
    model = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():  # logits far from uniform, so greedy ties are rare
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder / "llama")
    return folder / "llama"


def reference(path: Path):
    import transformers as tf

    if path.suffix == ".gguf":
        model = tf.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    else:
        model = tf.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.generation_config.eos_token_id = None  # decode exactly --new tokens
    model.generation_config.pad_token_id = 0
    return model.eval()


def timed(fn) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def measure(name: str, path: Path, prompt: torch.Tensor, new: int, repeats: int) -> str:
    ours = import_model(path).model.eval()
    theirs = reference(path)
    mask = torch.ones_like(prompt)

    def probe_run():
        return generate(ours, prompt, new)

    @torch.no_grad()
    def hf_run():
        return theirs.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False)

    probe_run(), hf_run()  # warm up
    times = {"probe": [], "transformers": []}
    outs = {}
    for i in range(repeats):  # alternate, so a busy moment hits both
        order = [("probe", probe_run), ("transformers", hf_run)]
        for label, fn in order if i % 2 == 0 else order[::-1]:
            seconds, outs[label] = timed(fn)
            times[label].append(seconds)
    same = torch.equal(outs["probe"], outs["transformers"])
    first = int((outs["probe"] != outs["transformers"]).any(0).float().argmax()) if not same else -1
    assert same, f"{name}: the continuations differ from token {first - prompt.shape[1]} on"
    ours_s, theirs_s = statistics.median(times["probe"]), statistics.median(times["transformers"])
    return (f"| {name} | {prompt.shape[1]} + {new} | {new / ours_s:.1f} | {new / theirs_s:.1f} | "
            f"{ours_s / theirs_s:.2f}x | equal |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=64, help="tokens to generate")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-real", action="store_true", help="the tiny Llama only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    smollm2 = bundled_path("smollm2")
    tokenizer = import_model(smollm2).tokenizer
    prompt = stream_rows(read_documents(), tokenizer, PROMPT, 1)[0][:1]  # [1, PROMPT]
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} thread(s), cpu, float32, greedy, batch 1, "
          f"median of {args.repeats}\n")  # fmt: skip
    print(
        "| model | prompt + new tokens | probe tokens/s | transformers tokens/s | "
        "probe time / transformers' | continuation |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_llama(Path(tmp))
        print(measure("tiny random Llama", path, prompt % 512, args.new, args.repeats), flush=True)
    if not args.skip_real:
        print(measure("SmolLM2-135M (Q4_1 GGUF)", smollm2, prompt, args.new, args.repeats))


if __name__ == "__main__":
    main()
