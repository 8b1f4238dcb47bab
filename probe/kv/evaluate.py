"""What a key/value plan costs and saves, measured: per-token loss on text with the plan's
streaming heads masked (the full forward `Transformer.forward(plan=)`, which the evicting cache
decodes exactly), needle accuracy with the needle decoded greedily through the evicting cache,
and the key/value bytes that cache really held after prefill and decoding (and the most it held
at once), against the full cache's on the same prompts.

How the prompt goes into the cache (`Prefill`) is the protocol, and it decides the result:

- `full` (the default; the papers'): the prompt prefilled with full attention in every head, then
  each streaming head's cache cut to its sink and window (`KVCache.cut`), as
  DuoAttention's and RazorAttention's reference code prefill; the prefill is the full model's, so
  the plan acts from the first decoded token on, and the peak memory is the full cache's;
- `chunked`: the prompt in calls of `chunk` tokens, each call's queries seeing what the cache
  held and the call's own keys, the streaming heads cut after each call (DuoAttention's chunked
  prefill), so the peak is bounded by a chunk;
- `masked`: a streaming head sees only its sink and window at every position of the prompt
  (StreamingLLM's token-by-token setting; the loss rows' protocol).

The needle prompts are `probe.analysis.retrieval.needle_prompts`' (shipped text as the haystack, a
needle of random words at a random depth, then the question); a prompt's `needle_accuracy` is the
share of the needle's tokens the greedy output has at their place, `needle_exact` whether the
whole needle came out right.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from probe.analysis.retrieval import NeedlePrompt
from probe.data.text import TextOptions, text_batches
from probe.kv.plan import Prefill
from probe.measure.batching import micro_batches
from probe.measure.loss import token_losses_and_hits
from probe.model import Transformer
from probe.model.cache import KVCache

COLUMNS = ["cache", "length", "metric", "value", "n"]


class Prefills:
    """Full prefills kept for reuse (the `full` mode's prefill does not depend on the plan, so
    every plan decodes from a cut of one): prompt tokens -> (the filled full cache, the last
    position's logits), while they hold at most `budget` bytes (beyond it, prefills are made
    again each time)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.held = budget, 0
        self._kept: dict[str, tuple[KVCache, torch.Tensor]] = {}
        self._model: int | None = None  # id of the one model whose prefills these are

    def get(self, model: Transformer, tokens: torch.Tensor) -> tuple[KVCache, torch.Tensor]:
        if self._model is not None and self._model != id(model):
            raise ValueError("these kept prefills are another model's; keep one Prefills per model")
        self._model = id(model)
        key = hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()
        if key in self._kept:
            return self._kept[key]
        made = _prefill(model, tokens, model.new_cache(), tokens.shape[0])
        if self.held + made[0].nbytes <= self.budget:
            self._kept[key] = made
            self.held += made[0].nbytes
        return made


def _prefill(model: Transformer, tokens: torch.Tensor, cache: KVCache, chunk: int
             ) -> tuple[KVCache, torch.Tensor]:  # fmt: skip
    """tokens [seq] into `cache` in calls of `chunk` tokens; (cache, the last position's logits
    [vocab]: only the last is projected onto the vocabulary)."""
    device = model.embed.weight.device
    for part in tokens.to(device).split(chunk):  # [<= chunk]
        hidden = model.features(part.unsqueeze(0), cache=cache)  # [1, part, d_model]
    return cache, model.logits(hidden[:, -1:])[0, -1]


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
def prefilled(model: Transformer, tokens: torch.Tensor, plan: Any = None,
              prefill: Prefill = Prefill(), kept: Prefills | None = None
              ) -> tuple[KVCache, torch.Tensor]:  # fmt: skip
    """The prompt tokens [seq] in a cache made with `plan` (None: the full cache) by `prefill`'s
    protocol: (the cache, the last position's logits [vocab]). `kept`: full prefills to reuse."""
    if prefill.mode == "masked":
        return _prefill(model, tokens, model.new_cache(plan), tokens.shape[0])
    if prefill.mode == "chunked":
        return _prefill(model, tokens, model.new_cache(plan, masked=False), prefill.chunk)
    full, logits = (kept.get(model, tokens) if kept is not None
                    else _prefill(model, tokens, model.new_cache(), tokens.shape[0]))  # fmt: skip
    if plan is None:  # a copy: decoding must not grow a kept prefill
        return full.cut([None] * len(full.sites), None), logits
    return full.cut(model.stream_rules(plan, masked=False), plan), logits


@torch.no_grad()
def decode_needle(model: Transformer, prompt: NeedlePrompt, plan: Any = None,
                  prefill: Prefill = Prefill(), kept: Prefills | None = None):  # fmt: skip
    """Greedy decoding of the needle after the question through a cache made with `plan`
    (None: the full cache) and filled by `prefill`: (generated [k] long, bytes the cache holds
    after the last step, the most it held at once)."""
    device = model.embed.weight.device
    k = len(prompt.answer)
    start = int(prompt.answer_steps[0]) + 1  # the prompt ends with the question
    cache, logits = prefilled(model, prompt.tokens[:start], plan, prefill, kept)
    generated = [int(logits.argmax())]
    while len(generated) < k:
        step = torch.tensor([[generated[-1]]], device=device)  # [1, 1]
        generated.append(int(model(step, cache=cache)[0, -1].argmax()))
    return torch.tensor(generated, dtype=torch.long), cache.nbytes, cache.peak_nbytes


def score_needle(model: Transformer, prompt: NeedlePrompt, plan: Any = None,
                 prefill: Prefill = Prefill(), kept: Prefills | None = None
                 ) -> tuple[float, float, int, int]:  # fmt: skip
    """(needle_accuracy: the share of the needle's tokens the greedy output has at their place,
    needle_exact: 1.0 when it has all of them, the bytes the cache held, the most it held at
    once) of one prompt."""
    generated, nbytes, peak = decode_needle(model, prompt, plan, prefill, kept)
    right = generated == prompt.answer  # [k]
    return float(right.double().mean()), float(right.all()), nbytes, peak


def needle_rows(model: Transformer, prompts: Sequence[NeedlePrompt], plan: Any,
                label: str = "plan", prefill: Prefill = Prefill(),
                kept: Prefills | None = None) -> list[dict]:  # fmt: skip
    """Rows (cache `label`) of needle_accuracy, needle_exact, kv_bytes (the mean over the
    prompts of the bytes held after prefill and decoding) and kv_peak_bytes (of the most held
    at once), per prompt length."""
    by_length: dict[int, list[tuple[float, float, int, int]]] = {}
    for p in prompts:
        by_length.setdefault(len(p.tokens), []).append(score_needle(model, p, plan, prefill,
                                                                    kept))  # fmt: skip
    rows = []
    metrics = ("needle_accuracy", "needle_exact", "kv_bytes", "kv_peak_bytes")
    for length, runs in sorted(by_length.items()):
        n = len(runs)
        for i, metric in enumerate(metrics):
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
    prefill: Prefill = Prefill(),
) -> pd.DataFrame:
    """Loss at each row width (masked: the streaming heads cut at every position) and needle
    rows (the prompt into the cache by `prefill`), with the plan (cache "plan") and with the
    full cache (cache "full"); columns cache, length, metric, value, n. Checks the plan first."""
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
    kept = Prefills(prefill_budget(model.embed.weight.device)) if prefill.mode == "full" else None
    rows += needle_rows(model, prompts, plan, "plan", prefill, kept)
    rows += needle_rows(model, prompts, None, "full", prefill, kept)
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table


def saved(table: pd.DataFrame) -> dict[int, float]:
    """Per needle length, the share of the full cache's bytes the plan saved."""
    b = table[table.metric == "kv_bytes"].pivot(index="length", columns="cache", values="value")
    return {int(n): 1 - r.plan / r.full if r.full else math.nan for n, r in b.iterrows()}


def prefill_budget(device: torch.device | str = "cpu") -> int:
    """Bytes of full prefills worth keeping for reuse on `device` (where the caches live): a
    quarter of the memory free there (1 GiB where it is not known)."""
    from probe.measure.memory import available_bytes

    device = torch.device(device)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = available_bytes() if device.type == "cpu" else None
    return free // 4 if free else 2**30
