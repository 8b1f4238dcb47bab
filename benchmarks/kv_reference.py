"""The papers' key/value-plan protocol written independently of probe, with transformers' public
attention interface, and the study's passkeys decoded by it and by probe side by side.

A plan names, per layer, the key/value heads that keep the whole cache; every other head
streams: after the prompt it keeps only the first `sink` tokens and the last `window` (Xiao et
al. 2024, StreamingLLM; Xiao et al. 2025, DuoAttention). As DuoAttention's and RazorAttention's
(Tang et al. 2024) reference code run it, the prompt is prefilled with full attention in every
head (or in chunks, each chunk's queries seeing what the cache held and the chunk's own keys),
each streaming head's cache is cut after each call, and a decoded token sees the cut cache plus
itself. Here transformers' DynamicCache keeps every key and a registered attention function
masks, per key/value head, the keys that head has evicted: a masked key weighs nothing in the
softmax, as an evicted one. tests/test_kv_reference.py checks probe's per-step logits against
this on a tiny Llama checkpoint; the script below decodes the smollm2-kv study's plans (its
kv.csv: --table, by default the committed results/smollm2-kv/tables/kv.csv) on its passkey
prompts with the reference and with probe's score_needle, and prints the exact keys of each:

    probe export /tmp/hand/sm --format hf --out /tmp/sm-hf
    nice timeout 3000 python benchmarks/kv_reference.py --lengths 1024 --seeds 0
    nice timeout 3000 python benchmarks/kv_reference.py --lengths 4096 --plans razor-0.2,full
"""

from __future__ import annotations

import argparse
import copy
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AttentionInterface, DynamicCache

NAME = "kv_reference"  # the attention implementation's registered name


@dataclass(frozen=True)
class Rule:
    """Per layer the key/value heads that keep the full cache; the others keep `sink` + the
    last `window` tokens."""

    full: tuple[frozenset[int], ...]
    sink: int
    window: int


def streamed_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                       kv_rule: Rule | None = None, **kwargs):  # fmt: skip
    """transformers' attention signature: query [b, h, q, d], key and value [b, kv, k, d] (every
    key so far, from the DynamicCache); returns ([b, q, h, d], weights [b, h, q, k]). The mask
    is built here (transformers builds none for a registered name), batch 1, no padding."""
    h, q_len = query.shape[1], query.shape[2]
    kv, k_len = key.shape[1], key.shape[2]
    start = k_len - q_len  # the call's first arrival index: the cache held 0..start-1 before it
    p = torch.arange(start, k_len, device=query.device).view(-1, 1)  # [q, 1]
    j = torch.arange(k_len, device=query.device).view(1, -1)  # [1, k]
    causal = j <= p  # [q, k]
    # a streaming head enters the call holding its sink and the last `window` keys before the
    # call, and sees the call's own keys causally (a first call sees every key: start <= 0)
    held = causal & ((j < kv_rule.sink) | (j >= start - kv_rule.window))  # [q, k]
    group = torch.arange(h, device=query.device) // (h // kv)  # [h] each query head's kv head
    full = kv_rule.full[module.layer_idx]
    streams = torch.tensor([int(g) not in full for g in group], device=query.device)  # [h]
    visible = torch.where(streams.view(-1, 1, 1), held, causal)  # [h, q, k]
    keys, values = key[:, group], value[:, group]  # [b, h, k, d]
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling  # [b, h, q, k]
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)  # [b, h, q, k]
    out = torch.matmul(weights, values).transpose(1, 2).contiguous()  # [b, q, h, d]
    return out, weights


def _forward(hf_model, ids: torch.Tensor, cache: DynamicCache, rule: Rule) -> torch.Tensor:
    """ids [q] into `cache` through the plan's attention: the last position's logits [vocab]."""
    before = hf_model.config._attn_implementation
    AttentionInterface.register(NAME, streamed_attention)
    hf_model.set_attn_implementation(NAME)
    try:
        out = hf_model(ids.view(1, -1), cache=cache, use_cache=True, logits_to_keep=1,
                       kv_rule=rule)  # fmt: skip
    finally:
        hf_model.set_attn_implementation(before)
    return out.logits[0, -1].float()


@torch.no_grad()
def reference_prefill(hf_model, tokens: torch.Tensor, rule: Rule, chunk: int | None = None
                      ) -> tuple[DynamicCache, torch.Tensor]:  # fmt: skip
    """tokens [n] in one call (full prefill) or calls of `chunk`: (cache, last logits [vocab])."""
    cache = DynamicCache(config=hf_model.config)
    for part in tokens.split(chunk or tokens.shape[0]):  # [<= chunk]
        logits = _forward(hf_model, part, cache, rule)
    return cache, logits


@torch.no_grad()
def reference_continue(hf_model, cache: DynamicCache, logits: torch.Tensor, rule: Rule,
                       steps: int, forced: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """From a prefill's last logits, `steps` greedy tokens one call each: (generated [steps],
    logits per step [steps, vocab]). `forced` [steps - 1]: the tokens fed instead of the
    greedy ones (teacher forcing)."""
    generated, per_step = [int(logits.argmax())], [logits]
    for i in range(steps - 1):
        fed = generated[-1] if forced is None else int(forced[i])
        per_step.append(_forward(hf_model, torch.tensor([fed]), cache, rule))
        generated.append(int(per_step[-1].argmax()))
    return torch.tensor(generated), torch.stack(per_step)


def reference_decode(hf_model, tokens: torch.Tensor, plan_full: list[set[int]], sink: int,
                     window: int, steps: int, chunk: int | None = None,
                     forced: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The prompt tokens [n] prefilled in full (or in calls of `chunk`), then `steps` tokens
    decoded greedily, with `plan_full` (per layer the full key/value heads) streaming the
    others: (generated ids [steps], logits per step [steps, vocab])."""
    rule = Rule(tuple(frozenset(f) for f in plan_full), sink, window)
    cache, logits = reference_prefill(hf_model, tokens, rule, chunk)
    return reference_continue(hf_model, cache, logits, rule, steps, forced)


def parse_full(names: str, layers: int, kv_heads: int) -> list[set[int]]:
    """kv.csv's `full` column ("L<layer>K<kv head>" space-separated, "all", or empty)."""
    if names == "all":
        return [set(range(kv_heads)) for _ in range(layers)]
    full: list[set[int]] = [set() for _ in range(layers)]
    for layer, head in re.findall(r"L(\d+)K(\d+)", names or ""):
        full[int(layer)].add(int(head))
    return full


def matched_window(share: float, heads: int, length: int, sink: int, window: int) -> int:
    """The study's memory-matched streaming window: every head streaming holds as many tokens
    as a plan with round(share * heads) full heads (the rest sink + window)."""
    kept = int(share * heads + 0.5) / heads
    held = kept * length + (1 - kept) * min(length, sink + window)
    return max(window, round(held) - sink)


def study_plans(table, length: int, seed: int, layers: int, kv_heads: int, sink: int,
                window: int) -> dict[str, tuple[list[set[int]], int]]:  # fmt: skip
    """The study's plans (its kv.csv `table`, a DataFrame) for one length and seed: label ->
    (full heads per layer, window)."""
    t = table[(table.metric == "needle_exact") & (table.length == length)
              & (table.seed == seed)]  # fmt: skip
    plans = {}
    for r in t.itertuples():
        label = r.method if r.method in ("full", "window") else f"{r.method}-{r.full_share:g}"
        w = window
        if r.method == "streaming" and r.full_share > 0:
            w = matched_window(r.full_share, layers * kv_heads, length, sink, window)
        plans[label] = (parse_full(r.full, layers, kv_heads), w)
    return plans


def main() -> None:
    args = _arguments()
    torch.set_num_threads(1)
    import pandas as pd
    from transformers import AutoModelForCausalLM

    from probe.checkpoint import load_checkpoint

    hf = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32,
                                              attn_implementation="eager").eval()  # fmt: skip
    ckpt = load_checkpoint(args.probe, dtype="float32")
    model, tokenizer = ckpt.model.eval(), ckpt.tokenizer()
    table = pd.read_csv(args.table, keep_default_na=False)  # an empty `full`: no full head
    rows = []
    for length in args.lengths:
        for seed in args.seeds:
            rows += _cells(hf, model, tokenizer, table, args.plans, length, seed)
    t = pd.DataFrame(rows)
    summary = t.groupby(["plan", "length"], sort=False).agg(
        prompts=("reference", "size"), reference=("reference", "sum"), probe=("probe", "sum"),
        same_tokens=("same_tokens", "sum"))  # fmt: skip
    print(summary.to_string())


def _cells(hf, model, tokenizer, table, chosen: list[str] | None, length: int, seed: int
           ) -> list[dict]:  # fmt: skip
    """The `chosen` plans (None: all) of the study's `table` on one length's and seed's
    prompts, by the reference and by probe's score_needle (full prefill): one row per plan and
    prompt."""
    from probe.kv.evaluate import Prefill, Prefills, decode_needle, score_needle
    from probe.kv.needles import passkey_prompts
    from probe.kv.plan import KVPlan

    layers, kv_heads = hf.config.num_hidden_layers, hf.config.num_key_value_heads
    sink, window = 4, 64  # the study's
    plans = study_plans(table, length, seed, layers, kv_heads, sink, window)
    rows = []
    for i, prompt in enumerate(passkey_prompts(tokenizer, 3, length, seed)):
        clock = time.perf_counter()
        start, steps = int(prompt.answer_steps[0]) + 1, len(prompt.answer)
        # the full prefill does not depend on the plan: one, copied for each plan's decoding
        every = Rule((frozenset(),) * layers, sink, window)
        prefilled, logits = reference_prefill(hf, prompt.tokens[:start], every)
        kept = Prefills(2**31)  # probe's own reuse of its full prefill, this prompt only
        for label, (full, w) in plans.items():
            if chosen and label not in chosen:
                continue
            s = 0 if label == "window" else sink
            rule = Rule(tuple(frozenset(f) for f in full), s, w)
            ours, _ = reference_continue(hf, copy.deepcopy(prefilled), logits, rule, steps)
            plan = None if label == "full" else KVPlan(
                "random", 0.0, s, w, tuple(tuple(sorted(f)) for f in full))  # fmt: skip
            _, exact, _, _ = score_needle(model, prompt, plan, Prefill("full"), kept)
            theirs, _, _ = decode_needle(model, prompt, plan, Prefill("full"), kept)
            row = {"plan": label, "length": length, "seed": seed, "prompt": i,
                   "reference": int(bool((ours == prompt.answer).all())), "probe": int(exact),
                   "same_tokens": int(torch.equal(ours, theirs)),
                   "reference_tokens": " ".join(map(str, ours.tolist())),
                   "probe_tokens": " ".join(map(str, theirs.tolist())),
                   "answer": " ".join(map(str, prompt.answer.tolist()))}  # fmt: skip
            print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
            rows.append(row)
        print(f"  length {length} seed {seed} prompt {i}: {time.perf_counter() - clock:.0f} s",
              flush=True)  # fmt: skip
    return rows


def _arguments() -> argparse.Namespace:
    here = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", default="/tmp/sm-hf", help="SmolLM2 exported to the HF format")
    ap.add_argument("--probe", default="/tmp/hand/sm", help="the same model's probe checkpoint")
    ap.add_argument("--table", type=Path, default=here / "results/smollm2-kv/tables/kv.csv",
                    help="the study's kv.csv (its `full` column names each plan's full heads)"
                    )  # fmt: skip
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1024, 2048, 4096])  # fmt: skip
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--plans", type=lambda s: s.split(","), default=None,
                    help="labels such as razor-0.2,full (default: every plan of the table)"
                    )  # fmt: skip
    return ap.parse_args()


if __name__ == "__main__":
    main()
