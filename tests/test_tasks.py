"""Tests for probe.data.tasks: every answer is re-derived from the prompt in plain Python."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.data.tasks import (
    BOS,
    EOS,
    MASK,
    N_SPECIAL,
    PAD,
    SEP,
    Batch,
    Form,
    TaskConfig,
    TaskName,
    answer_length,
    make_batch,
    parse_lengths,
    prompt_length,
    sample_length,
    score,
    sequence_length,
)
from probe.errors import ProbeError

TASKS = [TaskConfig(name, n_symbols=8) for name in TaskName] + [
    TaskConfig(TaskName.ADDITION, lsb_first=True)
]
PLUS_SYMBOL = 10  # addition: '+' is the symbol after the ten digits


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def split_example(batch: Batch, form: Form, row: int) -> tuple[list[int], list[int]]:
    """(prompt, scored answer) of one example, as symbol indices, checking the form's framing."""
    inputs = batch.inputs[row].tolist()
    targets = batch.targets[row].tolist()
    mask = batch.loss_mask[row].tolist()
    answer = [t for t, m in zip(targets, mask, strict=True) if m]
    if form is Form.ENCODER_DECODER:
        source = batch.source[row].tolist()
        assert source[-1] == EOS
        prompt = source[:-1]
        assert inputs == [BOS, *answer]
        assert targets == [*answer, EOS]
    else:
        assert batch.source is None
        assert inputs[0] == BOS
        sep = inputs.index(SEP)  # symbols are >= N_SPECIAL, so the first SEP ends the prompt
        prompt = inputs[1:sep]
        if form is Form.DECODER:
            assert inputs[1:] == targets[:-1]  # targets are the inputs shifted by one
            assert targets[sep - 1] == SEP and targets[-1] == EOS
            assert inputs[sep + 1 :] == answer  # teacher forcing: the answer follows SEP
        else:
            assert inputs[sep + 1 :] == [MASK] * len(answer)
            assert all(t == PAD for t, m in zip(targets, mask, strict=True) if not m)
            assert mask == [False] * (sep + 1) + [True] * len(answer)
    assert all(t >= N_SPECIAL for t in prompt + answer)
    return [t - N_SPECIAL for t in prompt], [t - N_SPECIAL for t in answer]


def expected_answer(task: TaskConfig, prompt: list[int], n: int) -> list[int]:
    """The answer computed independently with plain Python."""
    match task.name:
        case TaskName.COPY:
            return list(prompt)
        case TaskName.REVERSE:
            return prompt[::-1]
        case TaskName.SORT:
            return sorted(prompt)
        case TaskName.REPEAT_COPY:
            return prompt + prompt
        case TaskName.PARITY:
            assert set(prompt) <= {0, 1}
            return [sum(prompt) % 2]
        case TaskName.ADDITION:
            assert prompt.count(PLUS_SYMBOL) == 1 and prompt[n] == PLUS_SYMBOL
            a, b = prompt[:n], prompt[n + 1 :]
            order = (lambda d: d[::-1]) if task.lsb_first else (lambda d: d)
            total = int("".join(map(str, order(a)))) + int("".join(map(str, order(b))))
            return order([int(c) for c in str(total).zfill(n + 1)])
        case TaskName.RECALL:
            pairs, query = prompt[:-1], prompt[-1]
            keys, values = pairs[0::2], pairs[1::2]
            assert len(keys) == n and len(set(keys)) == n  # distinct keys
            assert query in keys
            return [dict(zip(keys, values, strict=True))[query]]
    raise AssertionError(task.name)


def check_batch(task: TaskConfig, form: Form, n: int, batch: Batch) -> None:
    batch_size = batch.inputs.shape[0]
    seq = sequence_length(task, form, n)
    assert batch.length == n
    assert batch.inputs.shape == batch.targets.shape == batch.loss_mask.shape == (batch_size, seq)
    assert batch.inputs.dtype == batch.targets.dtype == torch.long
    assert batch.loss_mask.dtype == torch.bool
    assert (batch.loss_mask.sum(dim=1) == answer_length(task, n)).all()
    tensors = [batch.inputs, batch.targets] + ([] if batch.source is None else [batch.source])
    assert all(int(t.min()) >= 0 and int(t.max()) < task.vocab_size for t in tensors)
    if form is Form.ENCODER_DECODER:
        assert batch.source.shape == (batch_size, prompt_length(task, n) + 1)
    for row in range(batch_size):
        prompt, answer = split_example(batch, form, row)
        assert len(prompt) == prompt_length(task, n)
        assert answer == expected_answer(task, prompt, n)


@pytest.mark.parametrize("form", list(Form))
@pytest.mark.parametrize("task", TASKS, ids=lambda t: f"{t.name}-lsb{int(t.lsb_first)}")
@pytest.mark.parametrize("n", [1, 2, 7])
def test_answers_match_independent_computation(task: TaskConfig, form: Form, n: int) -> None:
    check_batch(task, form, n, make_batch(task, form, n, 16, generator(n)))


@settings(max_examples=60, deadline=None)
@given(
    task=st.sampled_from(TASKS),
    form=st.sampled_from(list(Form)),
    n=st.integers(1, 8),
    batch_size=st.integers(1, 5),
    seed=st.integers(0, 2**31),
)
def test_answers_property(task: TaskConfig, form: Form, n: int, batch_size: int, seed: int) -> None:
    check_batch(task, form, n, make_batch(task, form, n, batch_size, generator(seed)))


def test_lengths_by_task() -> None:
    cases = {  # task: (prompt tokens, answer tokens) at n = 5
        "copy": (5, 5),
        "reverse": (5, 5),
        "sort": (5, 5),
        "repeat-copy": (5, 10),
        "addition": (11, 6),
        "parity": (5, 1),
        "recall": (11, 1),
    }
    for name, (n_prompt, n_answer) in cases.items():
        task = TaskConfig(name)
        assert (prompt_length(task, 5), answer_length(task, 5)) == (n_prompt, n_answer)
        assert sequence_length(task, "decoder", 5) == 1 + n_prompt + 1 + n_answer
        assert sequence_length(task, "encoder", 5) == 1 + n_prompt + 1 + n_answer
        assert sequence_length(task, "encoder-decoder", 5) == 1 + n_answer


def test_addition_has_carries_and_uniform_leading_zeros() -> None:
    task = TaskConfig("addition")
    batch = make_batch(task, Form.DECODER, 3, 500, generator(0))
    answers = [split_example(batch, Form.DECODER, row)[1] for row in range(500)]
    assert any(a[0] == 1 for a in answers)  # final carry into the extra digit
    assert any(a[0] == 0 for a in answers)
    prompts = batch.inputs[:, 1:4] - N_SPECIAL  # [500, 3] first operand
    assert (prompts[:, 0] == 0).any()  # leading zeros allowed


def test_vocab_size() -> None:
    assert TaskConfig("copy", n_symbols=16).vocab_size == N_SPECIAL + 16
    assert TaskConfig("recall", n_symbols=12).vocab_size == N_SPECIAL + 12
    assert TaskConfig("addition").vocab_size == N_SPECIAL + 11
    assert TaskConfig("parity").vocab_size == N_SPECIAL + 2


def test_same_seed_same_batch_and_different_seed_differs() -> None:
    for form in Form:
        task = TaskConfig("copy")
        first = make_batch(task, form, 8, 16, generator(3))
        again = make_batch(task, form, 8, 16, generator(3))
        other = make_batch(task, form, 8, 16, generator(4))
        assert torch.equal(first.inputs, again.inputs)
        assert torch.equal(first.targets, again.targets)
        assert torch.equal(first.loss_mask, again.loss_mask)
        assert not torch.equal(first.targets, other.targets)


def test_global_rng_untouched() -> None:
    before = torch.get_rng_state()
    for task in TASKS:
        make_batch(task, Form.DECODER, 4, 4, generator(0))
    assert torch.equal(before, torch.get_rng_state())


def test_batch_to_device() -> None:
    batch = make_batch(TaskConfig("sort"), Form.ENCODER_DECODER, 4, 2, generator(0))
    moved = batch.to("cpu")
    assert torch.equal(moved.source, batch.source) and moved.length == 4
    assert make_batch(TaskConfig(), Form.DECODER, 4, 2, generator(0)).to("cpu").source is None


@pytest.mark.parametrize("form", list(Form))
@pytest.mark.parametrize("name", ["sort", "addition", "recall"])
def test_score(name: str, form: Form) -> None:
    task = TaskConfig(name, n_symbols=8)
    batch = make_batch(task, form, 4, 6, generator(1))
    logits = torch.nn.functional.one_hot(batch.targets, task.vocab_size).float()  # [b, s, v]
    exact, correct = score(logits, batch)
    assert exact.dtype == torch.bool and exact.all()
    assert torch.equal(correct, torch.ones(6))

    unscored = (~batch.loss_mask[0]).nonzero()[0, 0]
    logits[0, unscored] = logits[0, unscored].roll(1)  # a wrong prediction outside the answer
    first_answer = batch.loss_mask[2].nonzero()[0, 0]
    logits[2, first_answer] = logits[2, first_answer].roll(1)  # one wrong answer token
    exact, correct = score(logits, batch)
    n_answer = answer_length(task, 4)
    assert exact.tolist() == [True, True, False, True, True, True]
    assert correct[2].item() == pytest.approx((n_answer - 1) / n_answer)
    assert correct[[0, 1, 3, 4, 5]].eq(1).all()


def test_score_rejects_mismatched_logits() -> None:
    batch = make_batch(TaskConfig(), Form.DECODER, 4, 2, generator(0))
    with pytest.raises(ProbeError, match="do not match"):
        score(torch.zeros(2, 3, 21), batch)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("4:16", list(range(4, 17))),
        ("1:32", list(range(1, 33))),
        ("8,16,32", [8, 16, 32]),
        ("32, 8,16", [8, 16, 32]),
        ("7", [7]),
        ("8:64:8", [8, 16, 24, 32, 40, 48, 56, 64]),
        ("4:6,5,10", [4, 5, 6, 10]),
        ("3:3", [3]),
    ],
)
def test_parse_lengths(spec: str, expected: list[int]) -> None:
    assert parse_lengths(spec) == expected


@pytest.mark.parametrize(
    "spec", ["", " ", "a", "4-16", "16:4", "0:4", "0", "4:", "1:2:0", "-3", "1.5"]
)
def test_parse_lengths_rejects(spec: str) -> None:
    with pytest.raises(ProbeError, match="Expected a range like '4:16'"):
        parse_lengths(spec)


def test_sample_length() -> None:
    draws = [sample_length(3, 6, generator(seed)) for seed in range(200)]
    assert set(draws) == {3, 4, 5, 6}
    assert sample_length(5, 5, generator(0)) == 5
    assert sample_length(1, 100, generator(9)) == sample_length(1, 100, generator(9))
    with pytest.raises(ProbeError, match="empty"):
        sample_length(6, 3, generator(0))


def test_unknown_task_did_you_mean() -> None:
    with pytest.raises(ProbeError, match="Did you mean 'copy'") as info:
        TaskConfig("cpoy")
    assert "Available: copy, reverse, sort, addition, parity, recall, repeat-copy" in str(
        info.value
    )
    with pytest.raises(ProbeError, match="Did you mean 'encoder'"):
        make_batch(TaskConfig(), "encodr", 4, 2, generator(0))


def test_name_coerced_from_string() -> None:
    task = TaskConfig("repeat-copy")
    assert task.name is TaskName.REPEAT_COPY
    assert task == TaskConfig(TaskName.REPEAT_COPY)


def test_recall_too_long_errors() -> None:
    task = TaskConfig("recall", n_symbols=4)
    check_batch(task, Form.DECODER, 4, make_batch(task, Form.DECODER, 4, 8, generator(0)))
    with pytest.raises(ProbeError, match="n_symbols=4"):
        make_batch(task, Form.DECODER, 5, 2, generator(0))
    with pytest.raises(ProbeError, match="distinct keys"):
        sequence_length(task, Form.ENCODER, 5)


@pytest.mark.parametrize(
    "kwargs", [{"n_symbols": 1}, {"n_symbols": 2.5}, {"n_symbols": True}, {"lsb_first": "yes"}]
)
def test_config_validation(kwargs: dict) -> None:
    with pytest.raises(ProbeError):
        TaskConfig(**kwargs)


@pytest.mark.parametrize(("length", "batch_size"), [(0, 2), (2, 0), (2.0, 2), (True, 2)])
def test_make_batch_validation(length: object, batch_size: object) -> None:
    with pytest.raises(ProbeError):
        make_batch(TaskConfig(), Form.DECODER, length, batch_size, generator(0))


def test_dict_round_trip() -> None:
    task = TaskConfig("addition", n_symbols=5, lsb_first=True)
    data = json.loads(json.dumps(task.to_dict()))
    assert data == {"name": "addition", "n_symbols": 5, "lsb_first": True}
    assert TaskConfig.from_dict(data) == task
    assert TaskConfig.from_dict({}) == TaskConfig()


def test_from_dict_rejects_unknown_key() -> None:
    with pytest.raises(ProbeError, match=r"'n_symbol'.*name, n_symbols, lsb_first"):
        TaskConfig.from_dict({"name": "copy", "n_symbol": 4})
