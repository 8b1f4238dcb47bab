"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"): heads that look at the token being copied when a model copies from its context.

A needle-in-a-haystack prompt is built from real text: a haystack of documents with a needle
sentence inside ("The secret passphrase is w1 w2 ... wk."), then the question ("... The secret
passphrase is") followed by the needle's words as the answer, teacher-forced. At every answer
step whose prediction is right (the model copies), a head scores a hit when its most-attended key
is the needle position of the token being copied. The retrieval score of a head is its hits over
all copying steps of all prompts; the model's copy accuracy is reported beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from probe.errors import ProbeError
from probe.model import AttentionCall, Transformer

NEEDLE = "The secret passphrase is"
QUESTION = "What is the secret passphrase? The secret passphrase is"


@dataclass(frozen=True)
class NeedlePrompt:
    tokens: torch.Tensor  # [seq] long: haystack with the needle, question, answer
    answer_steps: torch.Tensor  # [k] long: query positions that predict the answer tokens
    answer: torch.Tensor  # [k] long: the token each of those steps should produce
    sources: torch.Tensor  # [k] long: where in the needle that token stands (what to look at)


def needle_prompts(docs: Sequence[str], tokenizer, n_prompts: int, context: int,
                   words: int = 6, seed: int = 0) -> list[NeedlePrompt]:  # fmt: skip
    """`n_prompts` prompts of about `context` tokens: shipped text as the haystack, the needle
    (random words drawn from the text) at a random depth, then the question and the answer."""
    gen = torch.Generator().manual_seed(seed)
    text_ids = tokenizer.encode("\n".join(docs), add_special_tokens=False).ids
    vocab_words = sorted({w for d in docs for w in d.split() if w.isalpha() and len(w) > 3})
    if len(text_ids) < context or len(vocab_words) < words:
        raise ProbeError(
            f"The text is too short for {context}-token needle prompts ({len(text_ids)} tokens); "
            "give more text or a smaller context."
        )
    prompts = []
    for _ in range(n_prompts):
        pick = torch.randint(len(vocab_words), (words,), generator=gen).tolist()
        secret = " " + " ".join(vocab_words[i].lower() for i in pick)
        needle = tokenizer.encode(f" {NEEDLE}", add_special_tokens=False).ids
        secret_ids = tokenizer.encode(secret, add_special_tokens=False).ids
        question = tokenizer.encode(f"\n{QUESTION}", add_special_tokens=False).ids
        room = context - len(needle) - 2 * len(secret_ids) - len(question)
        if room < 8:
            raise ProbeError(
                f"{context} tokens leave no haystack around the needle and question; use "
                "needle prompts of at least 64 tokens."
            )
        start = int(torch.randint(len(text_ids) - room, (1,), generator=gen))
        hay = text_ids[start : start + room]
        depth = int(torch.randint(room + 1, (1,), generator=gen))
        before, after = hay[:depth], hay[depth:]
        ids = before + needle + secret_ids + after + question + secret_ids
        source_at = len(before) + len(needle)  # first needle-answer token
        answer_at = len(ids) - len(secret_ids)  # first answer token
        k = len(secret_ids)
        prompts.append(NeedlePrompt(
            torch.tensor(ids),
            torch.arange(answer_at - 1, answer_at - 1 + k),
            torch.tensor(secret_ids),
            torch.arange(source_at, source_at + k),
        ))  # fmt: skip
    return prompts


class _TopKey:
    """Observer: the most-attended key of every head at the answer steps of one prompt."""

    needs_weights = True

    def __init__(self, steps: torch.Tensor) -> None:
        self.steps = steps
        self.top: dict[int, tuple] = {}

    def record(self, call: AttentionCall) -> None:
        if call.site.cross or call.probs is None:
            return
        probs = call.probs[0, :, self.steps.to(call.probs.device)]  # [head, k, key]
        self.top[call.layer] = (call.site, probs.argmax(-1).cpu())  # [head, k]


@torch.no_grad()
def retrieval_scores(
    model: Transformer, prompts: Sequence[NeedlePrompt], require_copy: bool = True
) -> pd.DataFrame:
    """Retrieval score per head: columns layer, site, head, role ("retrieval"), score, offset
    (NaN), plus `copy_accuracy` (the share of answer tokens the model got right) and `steps`
    (the answer steps scored: those the model copied, as Wu et al. count, or every one when
    `require_copy` is False)."""
    device = next(model.parameters()).device
    hits: dict[tuple[int, int], float] = {}
    sites: dict[int, object] = {}
    copied = correct = total = 0
    was_training = model.training
    model.eval()
    try:
        for p in prompts:
            observer = _TopKey(p.answer_steps)
            with model.observe(observer):
                logits = model(p.tokens.to(device).unsqueeze(0))  # [1, seq, vocab]
            right = logits[0, p.answer_steps.to(device)].argmax(-1).cpu() == p.answer  # [k]
            correct += int(right.sum())
            total += len(p.answer)
            if not require_copy:
                right = torch.ones_like(right)
            copied += int(right.sum())
            for layer, (site, top) in observer.top.items():
                sites[layer] = site
                hit = (top == p.sources.view(1, -1)) & right.view(1, -1)  # [head, k]
                for i, head in enumerate(site.kept_heads):
                    hits[(layer, head)] = hits.get((layer, head), 0.0) + float(hit[i].sum())
    finally:
        model.train(was_training)
    rows = [
        {"layer": layer, "site": sites[layer].name, "head": head, "role": "retrieval",
         "score": hits[(layer, head)] / max(copied, 1), "offset": None,
         "copy_accuracy": correct / max(total, 1), "steps": copied}
        for layer, head in sorted(hits)
    ]  # fmt: skip
    return pd.DataFrame(rows)
