"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"): heads that look at the token being copied when a model copies from its context.

A needle-in-a-haystack prompt is built from real text: a haystack of documents with a needle
sentence inside ("The secret passphrase is w1 w2 ... wk."), then the question ("... The secret
passphrase is"); the needle's words w1 ... wk are the answer.

The retrieval score is Wu et al.'s, as the authors' code computes it (`retrieval_calculate` and
`retrieval_head_accumulate` in github.com/nightdessert/Retrieval_Head,
retrieval_head_detection.py): the model decodes GREEDILY after the question; at each decoding step
a head scores a hit when the token the model generates is in the needle and the head's
most-attended position (argmax over every key) is a needle position holding that same token. A
prompt's score is hits / needle length (its k answer tokens), and a head's score is the mean of its
prompt scores over the prompts the model retrieved (needle recall of the output above one half;
the authors use ROUGE-1 recall > 50 on words, here the share of the needle's tokens the output
contains, counted with multiplicity). The differences: the authors decode up to 50 tokens (until a
newline), here k, the needle's length, to bound the cost of decoding without a key/value cache
on a CPU; so a hit is a needle token copied within as many steps as the needle has tokens. As in
the authors' code (and unlike the paper's set notation |g_h & k| / |k|), hits are counted per
decoding step, not per needle position.

Beside it the table keeps two teacher-forced numbers, clearly named: `copy_accuracy`, the share of
answer tokens the model predicts right when fed the true answer, and `score_teacher_forced`,
hits over the steps it predicted right (the statistic this module computed before: it divides by
the copied steps instead of the needle length, so it exceeds Wu's score by about 1 / copy
accuracy).
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
    from probe.measure.memory import check_fits

    # each prompt holds its ids as Python ints and tensors (~24 bytes a token) and ~1 KB more
    check_fits(n_prompts * (24 * max(context, 0) + 1024),
               f"{n_prompts:,} needle prompts of {context:,} tokens",
               "fewer needle prompts")  # fmt: skip
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
        prompts.append(ending_in_answer(ids, secret_ids, len(before) + len(needle)))
    return prompts


def ending_in_answer(ids: list[int], answer: list[int], source_at: int) -> NeedlePrompt:
    """The prompt `ids`, which ends with the `answer` tokens, copied from `source_at` on."""
    k, answer_at = len(answer), len(ids) - len(answer)  # answer_at: the first answer token
    return NeedlePrompt(torch.tensor(ids), torch.arange(answer_at - 1, answer_at - 1 + k),
                        torch.tensor(answer), torch.arange(source_at, source_at + k))  # fmt: skip


class _TopKey:
    """Observer: the most-attended key of every head at the given query positions (the last
    query when `steps` is None), one forward pass."""

    needs_weights = True

    def __init__(self, steps: torch.Tensor | None) -> None:
        self.steps = steps
        self.top: dict[int, tuple] = {}

    def record(self, call: AttentionCall) -> None:
        if call.site.cross or call.probs is None:
            return
        if self.steps is None:
            probs = call.probs[0, :, -1:]  # [head, 1, key]
        else:
            probs = call.probs[0, :, self.steps.to(call.probs.device)]  # [head, k, key]
        self.top[call.layer] = (call.site, probs.argmax(-1).cpu())  # [head, k]


def _observed(model: Transformer, tokens: torch.Tensor, steps: torch.Tensor | None):
    """(logits [k, vocab] at the positions `steps` (None: the last one), {layer: (site, top
    [head, k])}) of one forward pass; only those positions go through the vocabulary
    projection."""
    device = next(model.parameters()).device
    observer = _TopKey(steps)
    with model.observe(observer):
        hidden = model.features(tokens.to(device).unsqueeze(0))[0]  # [seq, d_model]
    rows = hidden[-1:] if steps is None else hidden[steps.to(device)]  # [k, d_model]
    return model.logits(rows), observer.top  # [k, vocab]


def _hits(top: torch.Tensor, generated: torch.Tensor, tokens: torch.Tensor,
          needle: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """[head] hits: steps whose most-attended key is a needle position holding the token generated
    there (so that token is in the needle). top [head, k] key positions, generated [k], needle:
    the needle's positions (consecutive)."""
    in_needle = (top >= needle[0]) & (top <= needle[-1])  # [head, k]
    same = tokens[top.clamp(max=len(tokens) - 1)] == generated.view(1, -1)  # [head, k]
    return (in_needle & same).sum(-1)  # [head]


@dataclass
class _Greedy:
    generated: torch.Tensor  # [k] the tokens greedy decoding produced
    top: dict[int, tuple]  # layer -> (site, [head, k] most-attended key at each decoding step)


def _greedy(model: Transformer, p: NeedlePrompt, logits: torch.Tensor, teacher: dict) -> _Greedy:
    """Greedy decoding of k = len(answer) tokens after the question (`logits` [k, vocab]: the
    teacher-forced pass's at the answer steps). While the output equals the answer, the
    decoding step sees exactly the teacher-forced prefix, so its attention and prediction are
    read from the teacher-forced pass (a causal model); from the first token that differs on,
    each step is one more forward pass."""
    k = len(p.answer)
    start = int(p.answer_steps[0]) + 1  # where the answer begins
    predicted = logits.argmax(-1).cpu()  # [k]
    wrong = (predicted != p.answer).nonzero()
    same = k if len(wrong) == 0 else int(wrong[0]) + 1  # steps read off the teacher pass
    generated = predicted[:same].tolist()
    top = {layer: (site, [t[:, :same]]) for layer, (site, t) in teacher.items()}
    seq = torch.cat([p.tokens[:start], predicted[:same]])
    for _ in range(same, k):
        out, step = _observed(model, seq, None)
        token = int(out[-1].argmax())
        generated.append(token)
        for layer, (_site, t) in step.items():
            top[layer][1].append(t)
        seq = torch.cat([seq, torch.tensor([token])])
    joined = {layer: (site, torch.cat(parts, dim=1)) for layer, (site, parts) in top.items()}
    return _Greedy(torch.tensor(generated, dtype=torch.long), joined)


def needle_recall(generated: torch.Tensor, answer: torch.Tensor) -> float:
    """The share of the needle's tokens the output contains (each output token matched once)."""
    left = answer.tolist()
    for token in generated.tolist():
        if token in left:
            left.remove(token)
    return 1 - len(left) / max(len(answer), 1)


MIN_RECALL = 0.5  # Wu et al. accumulate a prompt's scores when ROUGE-1 recall exceeds 50


@torch.no_grad()
def retrieval_scores(model: Transformer, prompts: Sequence[NeedlePrompt]) -> pd.DataFrame:
    """Wu et al. 2024's retrieval score per head (see the module docstring): columns layer, site,
    head, role ("retrieval"), score (NaN when no prompt was retrieved), offset (NaN), prompts
    (the prompts retrieved, whose scores are averaged), recall (mean needle recall of the greedy
    outputs over all prompts), copy_accuracy and score_teacher_forced (teacher-forced, see the
    module docstring)."""
    scores: dict[tuple[int, int], float] = {}
    tf_hits: dict[tuple[int, int], float] = {}
    sites: dict[int, object] = {}
    retrieved = correct = total = 0
    recall = 0.0
    was_training = model.training
    model.eval()
    try:
        for p in prompts:
            logits, teacher = _observed(model, p.tokens, p.answer_steps)
            right = logits.argmax(-1).cpu() == p.answer  # [k]: logits at the answer steps
            correct += int(right.sum())
            total += len(p.answer)
            greedy = _greedy(model, p, logits, teacher)
            share = needle_recall(greedy.generated, p.answer)
            recall += share
            counted = share > MIN_RECALL
            retrieved += counted
            for layer, (site, top) in teacher.items():
                sites[layer] = site
                hit = (top == p.sources.view(1, -1)) & right.view(1, -1)  # [head, k]
                g_top = greedy.top[layer][1]
                g_hits = _hits(g_top, greedy.generated, p.tokens, p.sources)  # [head]
                for i, head in enumerate(site.kept_heads):
                    key = (layer, head)
                    tf_hits[key] = tf_hits.get(key, 0.0) + float(hit[i].sum())
                    scores[key] = scores.get(key, 0.0) + (
                        float(g_hits[i]) / len(p.answer) if counted else 0.0
                    )
    finally:
        model.train(was_training)
    rows = [
        {"layer": layer, "site": sites[layer].name, "head": head, "statistic": "retrieval",
         "value": scores[(layer, head)] / retrieved if retrieved else float("nan"),
         "offset": None, "prompts": retrieved, "recall": recall / max(len(prompts), 1),
         "copy_accuracy": correct / max(total, 1),
         "score_teacher_forced": tf_hits[(layer, head)] / max(correct, 1)}
        for layer, head in sorted(scores)
    ]  # fmt: skip
    return pd.DataFrame(rows)
