"""Synthetic sequence tasks for training and probing small Transformers.

Every task maps a random *prompt* of task length ``n`` to a deterministic *answer*. A batch holds
examples of one length only, so there is never padding inside a batch. Randomness comes only from
the explicit ``torch.Generator`` passed in; the same generator state gives the same batch.

Token layout (ids):

    0 PAD, 1 BOS, 2 SEP, 3 EOS, 4 MASK          special tokens (N_SPECIAL = 5)
    copy / reverse / sort / repeat-copy / recall: symbol i -> N_SPECIAL + i, i < n_symbols
        (recall: keys and values share this one alphabet)
    addition: digit d -> N_SPECIAL + d (d < 10), '+' -> N_SPECIAL + 10
    parity:   bit b   -> N_SPECIAL + b (b < 2)

Each task is shown to the model in one of three forms:

    decoder          inputs  = [BOS] prompt [SEP] answer          (the full s = ... answer [EOS],
                     targets = prompt [SEP] answer [EOS]           shifted by one)
                     loss on the answer tokens of targets (not on EOS)
    encoder          inputs  = [BOS] prompt [SEP] [MASK]*answer_len
                     targets = PAD everywhere except the answer at the MASK positions
    encoder-decoder  source  = prompt [EOS]; inputs = [BOS] answer; targets = answer [EOS]
                     loss on the answer tokens of targets (not on EOS)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from probe.data.task_spec import (  # re-exported: the names' old home
    BOS,
    EOS,
    LETTERS,  # noqa: F401
    MASK,
    MAX_LENGTHS,  # noqa: F401
    N_DIGITS,
    N_SPECIAL,
    PAD,
    PLUS,
    SEP,
    SPECIAL_NAMES,  # noqa: F401
    Form,
    TaskConfig,
    TaskName,
    _check_int,
    _check_length,
    answer_length,  # noqa: F401
    parse_lengths,  # noqa: F401
    prompt_length,  # noqa: F401
    sequence_length,  # noqa: F401
    token_name,  # noqa: F401
)
from probe.errors import ProbeError
from probe.fields import choice


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor  # [batch, seq] long: tokens fed to the (decoder side of the) model
    targets: torch.Tensor  # [batch, seq] long: target token at each input position (PAD: unscored)
    loss_mask: torch.Tensor  # [batch, seq] bool: True where the target is an answer token
    source: torch.Tensor | None  # [batch, src_seq] long: the prompt (encoder-decoder form only)
    length: int  # the task length n of every example in this batch
    # [batch, d_model] float: embeddings to stay close to (the embedding objective of imported
    # sentence encoders: the loss is 1 - cos(mean-pooled last hidden state, reference)), or None
    reference: torch.Tensor | None = None
    # what the batch is scored by: None for a task batch, else an imported model's objective on
    # text ("causal-lm", "masked-lm" or "embedding")
    objective: str | None = None

    def to(self, device: torch.device | str) -> Batch:
        source = None if self.source is None else self.source.to(device)
        reference = None if self.reference is None else self.reference.to(device)
        return replace(
            self,
            inputs=self.inputs.to(device),
            targets=self.targets.to(device),
            loss_mask=self.loss_mask.to(device),
            source=source,
            reference=reference,
        )

    def rows(self, keep: torch.Tensor) -> Batch:
        """The examples where `keep` [batch] (bool) is True."""
        return replace(
            self,
            inputs=self.inputs[keep],
            targets=self.targets[keep],
            loss_mask=self.loss_mask[keep],
            source=None if self.source is None else self.source[keep],
            reference=None if self.reference is None else self.reference[keep],
        )


def _symbols(n: int, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, n, shape, generator=generator, dtype=torch.long)


def _addition(
    length: int, batch_size: int, lsb_first: bool, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    a = _symbols(N_DIGITS, (batch_size, length), generator)  # [batch, n] most significant first
    b = _symbols(N_DIGITS, (batch_size, length), generator)  # [batch, n]
    total = torch.zeros(batch_size, length + 1, dtype=torch.long)  # [batch, n + 1]
    carry = torch.zeros(batch_size, dtype=torch.long)  # [batch]
    for j in range(length - 1, -1, -1):
        digit_sum = a[:, j] + b[:, j] + carry  # [batch]
        total[:, j + 1] = digit_sum % N_DIGITS
        carry = digit_sum // N_DIGITS
    total[:, 0] = carry
    if lsb_first:
        a, b, total = a.flip(1), b.flip(1), total.flip(1)
    plus = torch.full((batch_size, 1), PLUS - N_SPECIAL, dtype=torch.long)  # [batch, 1]
    prompt = torch.cat([a, plus, b], dim=1)  # [batch, 2n + 1]
    return prompt, total


def _recall(
    length: int, batch_size: int, n_symbols: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    noise = torch.rand(batch_size, n_symbols, generator=generator)  # [batch, n_symbols]
    keys = noise.argsort(dim=1)[:, :length]  # [batch, n] distinct keys
    values = _symbols(n_symbols, (batch_size, length), generator)  # [batch, n]
    which = _symbols(length, (batch_size, 1), generator)  # [batch, 1] index of the queried pair
    query = keys.gather(1, which)  # [batch, 1]
    answer = values.gather(1, which)  # [batch, 1]
    pairs = torch.stack([keys, values], dim=2).reshape(batch_size, 2 * length)  # [batch, 2n]
    prompt = torch.cat([pairs, query], dim=1)  # [batch, 2n + 1]
    return prompt, answer


def _prompt_and_answer(
    task: TaskConfig, length: int, batch_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and answer as symbol indices (not yet offset by N_SPECIAL)."""
    match task.name:
        case TaskName.ADDITION:
            return _addition(length, batch_size, task.lsb_first, generator)
        case TaskName.RECALL:
            return _recall(length, batch_size, task.n_symbols, generator)
        case TaskName.PARITY:
            bits = _symbols(2, (batch_size, length), generator)  # [batch, n]
            return bits, bits.sum(dim=1, keepdim=True) % 2  # [batch, 1]
    prompt = _symbols(task.n_symbols, (batch_size, length), generator)  # [batch, n]
    match task.name:
        case TaskName.COPY:
            answer = prompt.clone()  # [batch, n]
        case TaskName.REVERSE:
            answer = prompt.flip(1)  # [batch, n]
        case TaskName.SORT:
            answer = prompt.sort(dim=1).values  # [batch, n]
        case TaskName.REPEAT_COPY:
            answer = torch.cat([prompt, prompt], dim=1)  # [batch, 2n]
        case _:
            raise AssertionError(f"unhandled task {task.name}")
    return prompt, answer


def make_batch(
    task: TaskConfig,
    form: Form | str,
    length: int,
    batch_size: int,
    generator: torch.Generator,
) -> Batch:
    """A batch of ``batch_size`` examples of task length ``length``, built on the CPU."""
    if not isinstance(task, TaskConfig):
        raise ProbeError(f"task must be a TaskConfig, got {type(task).__name__}.")
    form = choice(Form, form, "form")
    length = _check_length(task, length)
    _check_int(batch_size, "batch_size", 1)
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
        raise ProbeError("make_batch needs a CPU torch.Generator; move the batch with Batch.to.")

    prompt, answer = _prompt_and_answer(task, length, batch_size, generator)
    prompt = prompt + N_SPECIAL  # [batch, n_prompt]
    answer = answer + N_SPECIAL  # [batch, n_answer]
    n_prompt, n_answer = prompt.shape[1], answer.shape[1]

    def column(token: int, width: int = 1) -> torch.Tensor:
        return torch.full((batch_size, width), token, dtype=torch.long)  # [batch, width]

    source = None
    if form is Form.DECODER:
        full = torch.cat([column(BOS), prompt, column(SEP), answer, column(EOS)], dim=1)
        inputs = full[:, :-1]  # [batch, n_prompt + n_answer + 2]
        targets = full[:, 1:]  # [batch, n_prompt + n_answer + 2]
        first = n_prompt + 1  # targets[first] is the first answer token
    elif form is Form.ENCODER:
        inputs = torch.cat([column(BOS), prompt, column(SEP), column(MASK, n_answer)], dim=1)
        targets = torch.cat([column(PAD, n_prompt + 2), answer], dim=1)  # [batch, seq]
        first = n_prompt + 2
    else:
        source = torch.cat([prompt, column(EOS)], dim=1)  # [batch, n_prompt + 1]
        inputs = torch.cat([column(BOS), answer], dim=1)  # [batch, n_answer + 1]
        targets = torch.cat([answer, column(EOS)], dim=1)  # [batch, n_answer + 1]
        first = 0
    loss_mask = torch.zeros(inputs.shape, dtype=torch.bool)  # [batch, seq]
    loss_mask[:, first : first + n_answer] = True
    return Batch(
        inputs=inputs.contiguous(),
        targets=targets.contiguous(),
        loss_mask=loss_mask,
        source=source,
        length=length,
    )


def sample_length(lo: int, hi: int, generator: torch.Generator) -> int:
    """A task length drawn uniformly from the integers ``lo..hi`` inclusive."""
    _check_int(lo, "The shortest length", 1)
    _check_int(hi, "The longest length", 1)
    if lo > hi:
        raise ProbeError(f"The length range is empty: lo={lo} is greater than hi={hi}.")
    return int(torch.randint(lo, hi + 1, (1,), generator=generator).item())


def score(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy (argmax) accuracy on the answer positions of ``batch``.

    Returns ``exact`` ([batch] bool: every answer token right) and ``correct_tokens``
    ([batch] float: fraction of answer tokens right).
    """
    if logits.dim() != 3 or logits.shape[:2] != batch.targets.shape:
        raise ProbeError(
            f"logits of shape {tuple(logits.shape)} do not match the batch targets "
            f"{tuple(batch.targets.shape)}; expected [batch, seq, vocab]."
        )
    predictions = logits.argmax(dim=-1)  # [batch, seq]
    mask = batch.loss_mask.to(predictions.device)  # [batch, seq]
    right = predictions == batch.targets.to(predictions.device)  # [batch, seq]
    exact = (right | ~mask).all(dim=1)  # [batch]
    n_answer = mask.sum(dim=1).clamp_min(1)  # [batch]
    correct_tokens = (right & mask).sum(dim=1).float() / n_answer  # [batch]
    return exact, correct_tokens
