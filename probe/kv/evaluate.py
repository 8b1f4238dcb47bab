"""What a key/value plan costs and saves, measured: per-token loss on text with the plan's
streaming heads masked (the full forward `Transformer.forward(plan=)`, which the evicting cache
decodes exactly), needle accuracy with the needle decoded greedily through the evicting cache
(`Transformer.new_cache(plan)`), and the key/value bytes that cache really allocated after
prefill and decoding, against the full cache's on the same prompts.

The needle prompts are `probe.analysis.retrieval.needle_prompts`' (shipped text as the haystack, a
needle of random words at a random depth, then the question); a prompt's `needle_accuracy` is the
share of the needle's tokens the greedy output has at their place, `needle_exact` whether the
whole needle came out right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from probe.analysis.retrieval import NeedlePrompt
from probe.data.text import TextOptions, text_batches
from probe.measure.batching import micro_batches
from probe.measure.loss import token_losses_and_hits
from probe.model import Transformer

COLUMNS = ["cache", "length", "metric", "value", "n"]


@torch.no_grad()
def plan_loss(model: Transformer, batches: Sequence, plan: Any = None,
              max_batch_tokens: int | None = None) -> dict[str, float]:  # fmt: skip
    """Mean next-token loss (and token count) of causal-LM text `batches` with `plan`'s
    streaming heads masked (None: the full cache)."""
    device = model.embed.weight.device
    total, count = 0.0, 0
    for b in micro_batches(batches, max_batch_tokens):
        b = b.to(device)
        hidden = model.features(b.inputs, plan=plan)[b.loss_mask]  # [scored, d_model]
        losses, _ = token_losses_and_hits(model, hidden, b.targets[b.loss_mask])
        total += float(losses.double().sum())
        count += int(b.loss_mask.sum())
    return {"loss": total / max(count, 1), "tokens": count}


@torch.no_grad()
def decode_needle(model: Transformer, prompt: NeedlePrompt, plan: Any = None):
    """Greedy decoding of the needle after the question through a cache made with `plan`
    (None: the full cache): (generated [k] long, bytes the cache holds after the last step)."""
    device = model.embed.weight.device
    k = len(prompt.answer)
    start = int(prompt.answer_steps[0]) + 1  # the prompt ends with the question
    cache = model.new_cache(plan)
    logits = model(prompt.tokens[:start].to(device).unsqueeze(0), cache=cache)  # [1, seq, V]
    generated = [int(logits[0, -1].argmax())]
    while len(generated) < k:
        step = torch.tensor([[generated[-1]]], device=device)  # [1, 1]
        generated.append(int(model(step, cache=cache)[0, -1].argmax()))
    return torch.tensor(generated, dtype=torch.long), cache.nbytes


def score_needle(model: Transformer, prompt: NeedlePrompt, plan: Any = None
                 ) -> tuple[float, float, int]:  # fmt: skip
    """(needle_accuracy: the share of the needle's tokens the greedy output has at their place,
    needle_exact: 1.0 when it has all of them, the bytes the cache held) of one prompt."""
    generated, nbytes = decode_needle(model, prompt, plan)
    right = generated == prompt.answer  # [k]
    return float(right.double().mean()), float(right.all()), nbytes


def needle_rows(model: Transformer, prompts: Sequence[NeedlePrompt], plan: Any,
                label: str = "plan") -> list[dict]:  # fmt: skip
    """Rows (cache `label`) of needle_accuracy, needle_exact and kv_bytes (the mean over the
    prompts of the bytes allocated after prefill and decoding), per prompt length."""
    by_length: dict[int, list[tuple[float, float, int]]] = {}
    for p in prompts:
        by_length.setdefault(len(p.tokens), []).append(score_needle(model, p, plan))
    rows = []
    for length, runs in sorted(by_length.items()):
        n = len(runs)
        for i, metric in enumerate(("needle_accuracy", "needle_exact", "kv_bytes")):
            value = sum(r[i] for r in runs) / n
            rows.append({"cache": label, "length": length, "metric": metric, "value": value,
                         "n": n})  # fmt: skip
    return rows


def evaluate_plan(
    model: Transformer,
    plan: Any,
    tokenizer,
    docs: Sequence[str],
    widths: Sequence[int],
    prompts: Sequence[NeedlePrompt],
    batch_size: int,
    n_batches: int,
    seed: int = 0,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Loss at each row width and needle rows, with the plan (cache "plan") and with the full
    cache (cache "full"); columns cache, length, metric, value, n. Checks the plan first."""
    model.stream_rules(plan)  # one line when the plan does not fit the model
    options = TextOptions(width="--lengths")
    rows = []
    for width in widths:
        batches = text_batches(docs, tokenizer, "causal-lm", width, batch_size, n_batches, seed,
                               options)  # fmt: skip
        for label, applied in (("plan", plan), ("full", None)):
            m = plan_loss(model, batches, applied, max_batch_tokens)
            rows.append({"cache": label, "length": width, "metric": "loss", "value": m["loss"],
                         "n": m["tokens"]})  # fmt: skip
    rows += needle_rows(model, prompts, plan, "plan")
    rows += needle_rows(model, prompts, None, "full")
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table


def saved(table: pd.DataFrame) -> dict[int, float]:
    """Per needle length, the share of the full cache's bytes the plan saved."""
    b = table[table.metric == "kv_bytes"].pivot(index="length", columns="cache", values="value")
    return {int(n): 1 - r.plan / r.full if r.full else math.nan for n, r in b.iterrows()}
