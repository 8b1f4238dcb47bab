"""Passkey prompts: the long-context retrieval test of the key/value-cache papers (Mohtashami and
Jaggi 2023's passkey task, as StreamingLLM and DuoAttention evaluate it).

A prompt of exactly `length` tokens: an instruction, a haystack of bland filler sentences with
the passkey sentence ("The pass key is 49303. Remember it. 49303 is the pass key.") at some
depth, then the question ("What is the pass key? The pass key is") and the key's digits, which
are the answer the model must decode. The seed draws the keys, the depths and the haystack (its
sentences are drawn from a pool of filler, so the seeds differ in their haystacks too); the
depths of a seed's n prompts are spread over the haystack, one in each n-th of it.
"""

from __future__ import annotations

import torch

from probe.analysis.retrieval import NeedlePrompt, ending_in_answer
from probe.errors import ProbeError

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
         "memorize it. I will quiz you about the important information there.")  # fmt: skip
FILLER = (
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
    " The river flows to the sea.",
    " The hills are quiet.",
    " The road goes on.",
)
QUESTION = " What is the pass key? The pass key is"
DIGITS = 5


def passkey_prompts(tokenizer, n: int, length: int, seed: int = 0) -> list[NeedlePrompt]:
    """`n` passkey prompts of exactly `length` tokens; the answer is the key's tokens (the
    leading space and the digits) after the question."""
    gen = torch.Generator().manual_seed(seed)

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    intro, question = ids(INTRO), ids(QUESTION)
    pool = [ids(s) for s in FILLER]
    prompts = []
    for i in range(n):
        key = "".join(str(int(d)) for d in torch.randint(10, (DIGITS,), generator=gen))
        before, answer = ids(" The pass key is"), ids(f" {key}")
        after = ids(f". Remember it. {key} is the pass key.")
        needle = before + answer + after
        room = length - len(intro) - len(needle) - len(question) - len(answer)
        if room < len(pool[0]):
            raise ProbeError(
                f"{length}-token passkey prompts leave no room for a haystack; use at least "
                f"{length - room + len(pool[0])} tokens."
            )
        hay: list[int] = []
        while len(hay) < room:
            hay += pool[int(torch.randint(len(pool), (1,), generator=gen))]
        hay = hay[:room]
        depth = int((i + float(torch.rand((), generator=gen))) / n * room)
        tokens = intro + hay[:depth] + needle + hay[depth:] + question + answer
        prompts.append(ending_in_answer(tokens, answer, len(intro) + depth + len(before)))
    return prompts
