"""Benchmark: fidelity of probe's forward pass in float32, bfloat16 and float16, against
transformers in the same dtype and against probe's own float32, printed as Markdown rows.

For each family: tiny random configs of BERT (masked LM), GPT-2, Llama (grouped-query
attention), Mistral (sliding window of 32 keys), Qwen2, Qwen3 (QK-norm, a window on layer 1),
Phi-3 (fused projections, partial rotary, a window of 32 keys), GPT-NeoX (Pythia's parallel
residual and partial rotary), OLMo-2 (branch norms, QK-norm over all heads), Gemma, Gemma 2
(soft-capping, its default window on alternate layers cut to 32 keys), Gemma 3 (QK-norm; a
local layer of 32 keys, then a global one), SmolLM3 (a layer without rotary) and the rotary
scalings real checkpoints ship with, their original context L cut to 32 so the rows are 4L long
(Llama 3.1's llama3, Qwen2 with YaRN, Phi-3.5's LongRoPE, OLMo-3's YaRN on its full-attention
layers beside a window of 32 keys), built in transformers with weights of std 0.2
(logits of a few units, attention far from uniform) and the real vocabulary of the bundled
tokenizers; and the two bundled real models, MiniLM (BERT family, all-MiniLM-L6-v2, a sentence
encoder: its last hidden state is compared, it has no logits) and SmolLM2-135M (Llama family,
the Q4_1 GGUF, dequantized; transformers loads the same file into
LlamaForCausalLM). Inputs: rows of 128 tokens of the shipped text (`probe.data.text`), tokenized by
the bundled model of the family (SmolLM2's tokenizer for the decoders, MiniLM's for BERT).

transformers is loaded with `from_pretrained(..., dtype=DTYPE)` (which keeps its rotary
frequencies float32); probe imports the model (float32) and casts it with `.to(DTYPE)`.
Columns: max |logit difference| against transformers in the same dtype and against probe in
float32; transformers' own max |difference| between that dtype and its float32 (the rounding
noise of the dtype, for scale); top-1 agreement with transformers in the same dtype over every
position (the next token for decoders, the masked-LM prediction for BERT). Targets: float32
<= 1e-4; bf16 top-1 agreement >= 99%.

    .venv/bin/python benchmarks/bench_fidelity.py [--rows 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch

from probe.data.text import read_documents, stream_rows
from probe.interop.bundled import bundled_path
from probe.interop.importer import import_model

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
WIDTH = 128  # tokens per row


def tiny_source(kind: str, vocab: int, folder: Path) -> Path:
    """A small random transformers model of family `kind`, saved to `folder / kind`."""
    import transformers as tf

    torch.manual_seed(0)
    shape = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128)  # fmt: skip
    if kind == "BERT":
        model = tf.BertForMaskedLM(tf.BertConfig(**shape, max_position_embeddings=WIDTH))
    elif kind == "GPT-2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=WIDTH)
        model = tf.GPT2LMHeadModel(cfg)
    elif kind == "Llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**shape, num_key_value_heads=2))
    elif kind == "Mistral":
        model = tf.MistralForCausalLM(
            tf.MistralConfig(**shape, num_key_value_heads=2, sliding_window=32)
        )
    elif kind == "GPT-NeoX":  # Pythia's shape: parallel residual, rotary on a quarter of a head
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**shape, max_position_embeddings=WIDTH))
    elif kind == "OLMo-2":
        model = tf.Olmo2ForCausalLM(tf.Olmo2Config(**shape, num_key_value_heads=2))
    elif kind == "Gemma":
        model = tf.GemmaForCausalLM(tf.GemmaConfig(**shape, num_key_value_heads=2, head_dim=16))
    elif kind == "Gemma 2":
        local = dict(num_key_value_heads=2, head_dim=16, sliding_window=32)
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**shape, **local))
    elif kind == "Gemma 3":
        local = dict(num_key_value_heads=2, head_dim=16, sliding_window=32,
                     layer_types=["sliding_attention", "full_attention"])  # fmt: skip
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**shape, **local))
    elif kind == "Qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**shape, num_key_value_heads=2))
    elif kind == "Qwen3":  # QK-norm, head_dim 24 (not 64 / 4), a window of 32 keys on layer 1
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**shape, num_key_value_heads=2, head_dim=24,
                                                   use_sliding_window=True, sliding_window=32,
                                                   max_window_layers=1))  # fmt: skip
    elif kind == "Phi-3":  # fused qkv and gate/up, rotary on half of each head, window 32
        cfg = tf.Phi3Config(**shape, num_key_value_heads=2, partial_rotary_factor=0.5,
                            sliding_window=32)  # fmt: skip
        model = tf.Phi3ForCausalLM(cfg)
    elif kind == "SmolLM3":  # no rotary on layer 1
        cfg = tf.SmolLM3Config(**shape, num_key_value_heads=2, no_rope_layer_interval=2,
                               pad_token_id=0)  # fmt: skip
        model = tf.SmolLM3ForCausalLM(cfg)
    else:  # a scaled rotary, its original context L = 32 (the rows are 4L long)
        model = scaled_source(kind, shape)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith("bias") or "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder / kind)
    return folder / kind


# the scaled-rotary configs: Llama 3.1's llama3, Qwen's YaRN section, Phi-3.5's LongRoPE (factors
# rising from 1 to 16, not its real values) and OLMo-3's YaRN on its full-attention layers
_L = WIDTH // 4
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": _L,
         "rope_theta": 1e6}  # fmt: skip
SCALED = {
    "Llama 3.1 (llama3 x8)": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": _L,
                              "rope_theta": 5e5},
    "Qwen2 (YaRN x4)": _YARN,
    "Phi-3.5 (longrope)": {"rope_type": "longrope", "rope_theta": 1e4,
                           "short_factor": [1.0 + 0.01 * i for i in range(8)],
                           "long_factor": [1.0 + 15 * (i / 7) ** 3 for i in range(8)]},
    "OLMo-3 (YaRN x4 on full layers)": _YARN,
}  # fmt: skip


def scaled_source(kind: str, shape: dict):
    """A transformers model of `kind` in SCALED, 4L positions long."""
    import transformers as tf

    section, long = SCALED[kind], dict(max_position_embeddings=WIDTH, num_key_value_heads=2)
    if kind.startswith("Llama"):
        return tf.LlamaForCausalLM(tf.LlamaConfig(**shape, **long, rope_parameters=section))
    if kind.startswith("Qwen2"):
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**shape, **long, rope_parameters=section))
    if kind.startswith("Phi"):  # head_dim 16, rotary on all of it: 8 pairs
        cfg = tf.Phi3Config(**shape, **long, rope_parameters=section,
                            original_max_position_embeddings=_L)  # fmt: skip
        return tf.Phi3ForCausalLM(cfg)
    local = {"rope_type": "default", "rope_theta": 1e6}
    cfg = tf.Olmo3Config(**shape, **long, sliding_window=32,
                         layer_types=["sliding_attention", "full_attention"],
                         rope_parameters={"full_attention": section,
                                          "sliding_attention": local})  # fmt: skip
    return tf.Olmo3ForCausalLM(cfg)


def reference(kind: str, path: Path, dtype: torch.dtype):
    """transformers' model of `path` loaded in `dtype` (sdpa attention, its default)."""
    import transformers as tf

    if kind == "MiniLM":
        return tf.BertModel.from_pretrained(str(path), dtype=dtype).eval()
    if kind == "BERT":
        return tf.BertForMaskedLM.from_pretrained(str(path), dtype=dtype).eval()
    if path.suffix == ".gguf":
        return tf.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype
        ).eval()
    return tf.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


@torch.no_grad()
def outputs(model, tokens: torch.Tensor, probe: bool, hidden: bool) -> torch.Tensor:
    """Logits (or the last hidden state), float32, one row at a time."""
    rows = []
    for row in tokens.split(1):
        if probe:
            rows.append(model.features(row) if hidden else model(row))
        else:
            out = model(row)
            rows.append(out.last_hidden_state if hidden else out.logits)
    return torch.cat(rows).float()


def measure(kind: str, source: str, path: Path, tokens: torch.Tensor) -> list[str]:
    hidden = kind == "MiniLM"
    ours32 = import_model(path).model.eval()
    theirs32 = None
    base = None
    lines = []
    for dtype in DTYPES:
        start = time.perf_counter()
        ref = reference(kind, path, dtype)
        theirs = outputs(ref, tokens, probe=False, hidden=hidden)
        del ref
        model = ours32 if dtype == torch.float32 else copy.deepcopy(ours32).to(dtype)
        ours = outputs(model, tokens, probe=True, hidden=hidden)
        del model
        if dtype == torch.float32:
            theirs32, base = theirs, ours
        gap = float((ours - theirs).abs().max())
        own = float((ours - base).abs().max())
        noise = float((theirs - theirs32).abs().max())
        top1 = "n/a (no logits)" if hidden else (
            f"{float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()):.2%}"
        )  # fmt: skip
        name = str(dtype).removeprefix("torch.")
        lines.append(f"| {kind} | {source} | {name} | {gap:.2e} | {own:.2e} | {noise:.2e} | "
                     f"{top1} | {float(theirs32.abs().max()):.1f} |")  # fmt: skip
        print(lines[-1] + f"  <!-- {time.perf_counter() - start:.0f} s -->", flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4, help="rows of 128 tokens of text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-real", action="store_true", help="tiny random configs only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    docs = read_documents()
    minilm, smollm2 = bundled_path("minilm"), bundled_path("smollm2")
    decoder_tok = import_model(smollm2).tokenizer
    bert_tok = import_model(minilm).tokenizer
    text = {
        "decoder": stream_rows(docs, decoder_tok, WIDTH, args.rows)[0][: args.rows],
        "bert": stream_rows(docs, bert_tok, WIDTH, args.rows)[0][: args.rows],
    }
    print(f"torch {torch.__version__}, {args.threads} thread(s), cpu; {args.rows} rows x "
          f"{WIDTH} tokens of the shipped text\n")  # fmt: skip
    print("| family | model | dtype | max abs diff vs transformers, same dtype | "
          "max abs diff vs probe float32 | transformers' own diff vs its float32 | "
          "top-1 agreement with transformers | max abs logit (MiniLM: hidden) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("BERT", "GPT-2", "Llama", "Mistral", "Qwen2", "Qwen3", "Phi-3", "GPT-NeoX",
                     "OLMo-2", "Gemma", "Gemma 2", "Gemma 3", "SmolLM3", *SCALED):  # fmt: skip
            tokens = text["bert" if kind == "BERT" else "decoder"]
            vocab = bert_tok.get_vocab_size() if kind == "BERT" else decoder_tok.get_vocab_size()
            path = tiny_source(kind, vocab, Path(tmp))
            measure(kind, "tiny random (2 x 4 heads, d 64)", path, tokens)
    if not args.skip_real:
        measure("MiniLM", "bundled:minilm (BERT family)", minilm, text["bert"])
        measure("SmolLM2", "bundled:smollm2 (Llama family, Q4_1 GGUF)", smollm2,
                text["decoder"])  # fmt: skip


if __name__ == "__main__":
    main()
