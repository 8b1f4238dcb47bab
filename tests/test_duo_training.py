"""DuoAttention's gate training as the reference runs it (mit-han-lab/duo-attention): the
learning-rate schedule against the reference's formula, written out here; the gates' path under a
constant gradient (attention switched off, so only the L1 penalty pushes) against Adam's closed
form, and the early stop at the step the summed rates reach 1; the undecided count and median
against a count of the returned gates; passkey prompts in text holding each key at its stated
depth and its question at the end (checked by decoding a byte-level tokenizer's ids); bounds and
misfits as one line."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import torch
from test_kv_duo import gqa_rope

from probe.config import ModelConfig
from probe.data.text import read_documents
from probe.errors import ProbeError
from probe.kv.duo import (
    FRAME,
    NEEDLE,
    QUESTION,
    SEPARATOR,
    WORDS,
    duo_gates,
    lr_scale,
    text_passkeys,
)
from probe.kv.methods import METHODS
from probe.kv.methods.duo import DuoSettings
from probe.kv.planning import make_plan
from probe.model import Transformer

SINK, WINDOW = 2, 8
ORDERS = ("first", "second")
LENGTH = 512  # tokens per text prompt in the tests


def reference_scale(step: int, steps: int) -> float:
    """The reference's LambdaLR factor (duo_attn/train.py), a fifth of warm-up and of decay."""
    fifth = steps // 5
    return min(1, max((step + 1) / fifth, 0.1), max((steps - step) / fifth, 0.1))


def test_the_schedule_is_the_reference_s():
    for steps in range(5, 80):
        got = [lr_scale(s, steps, 0.2) for s in range(steps)]
        assert got == pytest.approx([reference_scale(s, steps) for s in range(steps)])
    assert [lr_scale(s, 10, 0.2) for s in range(10)] == [0.5, 1, 1, 1, 1, 1, 1, 1, 1, 0.5]
    ramp = [lr_scale(s, 32, 0.2) for s in range(32)]  # a ramp of 6 steps at each end
    assert ramp[:6] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1])
    assert ramp[-6:] == pytest.approx([1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    assert lr_scale(0, 100, 0.5) == 0.1 and lr_scale(4, 100, 0.5) == 0.1  # the floor: 1/50, 5/50
    assert lr_scale(49, 100, 0.5) == 1.0 and lr_scale(99, 100, 0.5) == 0.1
    assert {lr_scale(s, 4, 0.2) for s in range(4)} == {1.0}  # 4 // 5 = 0: no ramp
    assert {lr_scale(s, 50, 0.0) for s in range(50)} == {1.0}


def deaf() -> Transformer:
    """gqa_rope with every attention output projection zeroed: the mixed model is the full one
    whatever the gates, so only the L1 penalty (l1 / gates, the same for each) moves them."""
    model = gqa_rope()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o.weight.zero_()
    return model


def test_under_a_constant_push_the_gates_fall_by_the_scheduled_rates():
    """Adam moves a parameter by exactly its rate a step when the gradient never changes (bias-
    corrected moments g and g^2), so each gate ends at 1 - lr * sum of the step's factors."""
    settings = DuoSettings(steps=10, lr=0.05, l1=0.05, warmup=0.2)
    alphas, notes = duo_gates(deaf(), SINK, WINDOW, settings)
    expected = 1 - 0.05 * sum(reference_scale(s, 10) for s in range(10))  # 1 - 0.05 * 9 = 0.55
    assert expected == pytest.approx(0.55)
    for a in alphas:
        torch.testing.assert_close(a, torch.full((2,), expected), rtol=0, atol=1e-5)
    assert notes["duo_steps_run"] == 10 and not notes["duo_separated"]
    assert notes["duo_undecided"] == 4 and notes["duo_gate_median"] == pytest.approx(expected)
    assert notes["duo_distill_first"] == 0.0 and notes["duo_prompts"] == "random tokens"


def test_training_stops_once_the_gates_have_separated():
    """The gates reach 0 (clamped) at the first step whose summed rates reach 1 (lr 0.1, a ramp
    of 8: 0.0125, 0.0375, ... 0.45 after 8 steps, then 0.1 a step: 1.05 after 14), and not
    before: at the start every gate is within 0.05 of 1 but none has moved."""
    settings = DuoSettings(steps=40, lr=0.1, l1=0.05, warmup=0.2)
    reach, stop = 0.0, None
    for s in range(40):
        reach += 0.1 * reference_scale(s, 40)
        if reach >= 1 and stop is None:
            stop = s + 1
    assert stop == 14
    alphas, notes = duo_gates(deaf(), SINK, WINDOW, settings)
    assert notes["duo_steps_run"] == stop and notes["duo_separated"]
    assert all(torch.equal(a, torch.zeros(2)) for a in alphas)
    assert notes["duo_undecided"] == 0 and notes["duo_gate_median"] == 0.0


def test_the_undecided_count_and_median_are_those_of_the_gates():
    settings = DuoSettings(steps=20, lr=0.1, l1=0.05)
    alphas, notes = duo_gates(gqa_rope(), SINK, WINDOW, settings, seed=1)
    flat = [v for a in alphas for v in a.tolist()]
    counted = sum(1 for v in flat if 0.05 < v < 0.95)
    assert 0 < counted < len(flat)  # a case with both kinds
    assert notes["duo_undecided"] == counted and not notes["duo_separated"]
    assert notes["duo_gate_median"] == pytest.approx(statistics.median(flat))
    assert notes["duo_steps_run"] == 20


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE tokenizer trained on the shipped corpus (decoding its ids gives back
    the exact text, so the prompts can be checked as strings)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(read_documents(None), trainer)
    return tok


def test_text_prompts_hold_each_passkey_at_its_depth_and_ask_for_it_at_the_end(bpe):
    docs = read_documents(None)
    corpus = "\n".join(docs)
    prompts = text_passkeys(docs, bpe, 3, LENGTH, passkeys=2, words=6, seed=4)
    assert len(prompts) == 3 and len({tuple(p.tokens.tolist()) for p in prompts}) == 3

    def ids(text: str) -> list[int]:
        return bpe.encode(text, add_special_tokens=False).ids

    for p in prompts:
        tokens = p.tokens.tolist()
        assert len(tokens) == LENGTH
        tail = bpe.decode(tokens[p.targets[0] :])  # the targets: the whole tail, in order
        assert p.targets.tolist() == list(range(p.targets[0], LENGTH))
        keys = []
        for order in ORDERS:
            question = QUESTION.format(order)
            at = tail.index(question) + len(question)
            keys.append(tail[at:].split(SEPARATOR)[0])
            assert len(keys[-1].split()) == 6 and set(keys[-1].split()) <= set(WORDS)
        assert tail == "".join(QUESTION.format(o) + k + SEPARATOR
                               for o, k in zip(ORDERS, keys, strict=True))  # fmt: skip
        assert bpe.decode(tokens[: p.targets[0]]).endswith(FRAME[1])
        assert bpe.decode(tokens).startswith(FRAME[0])
        # each key stands where key_at says, after its needle; the text around is the corpus's
        # the pieces are tokenized apart, as the reference does: a needle and key inserted
        inserts = [SEPARATOR + NEEDLE.format(o) + k + SEPARATOR
                   for o, k in zip(ORDERS, keys, strict=True)]  # fmt: skip
        sizes = [2 * len(ids(SEPARATOR)) + len(ids(NEEDLE.format(o))) + len(ids(k))
                 for o, k in zip(ORDERS, keys, strict=True)]  # fmt: skip
        before, after = len(ids(FRAME[0])), len(ids(FRAME[1]))
        room = LENGTH - before - after - len(p.targets) - sum(sizes)
        for i, key in enumerate(keys):
            assert bpe.decode(tokens[p.key_at[i] : p.key_at[i] + len(ids(key))]) == key
            needle = len(ids(SEPARATOR)) + len(ids(NEEDLE.format(ORDERS[i])))
            said = bpe.decode(tokens[p.key_at[i] - needle : p.key_at[i]])
            assert said == SEPARATOR + NEEDLE.format(ORDERS[i])
            text_before = p.key_at[i] - needle - before - sum(sizes[:i])
            assert text_before == int(room * p.depths[i])  # the stated depth, in text tokens
            assert 0.05 <= p.depths[i] <= 0.95
        body = bpe.decode(tokens[before : p.targets[0] - after])
        for s in inserts:
            body = body.replace(s, "")
        assert body in corpus  # one stretch of the text, the passkeys cut out


def test_the_gates_train_on_text_prompts_and_say_so(bpe):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=bpe.get_vocab_size(), n_layer=2, n_head=4, n_kv_head=2,
                      d_model=32, pe="learned", max_len=256)  # fmt: skip
    model = Transformer(cfg).eval()
    how = METHODS.get("duo")
    options = DuoSettings(steps=2, prompt_tokens=256, passkeys=1, key_words=4)
    prompts = how.prompts(read_documents(None), bpe, options, 0)
    assert len(prompts) == 2 and {len(p.tokens) for p in prompts} == {256}
    result = make_plan(model, "duo", 0.5, SINK, WINDOW, options=options, prompts=prompts)
    notes = result.notes
    assert notes["duo_prompts"] == "passkeys in text" and notes["duo_prompt_tokens"] == 256
    assert notes["duo_passkeys"] == 1 and notes["duo_steps_run"] == 2
    assert (notes["duo_train_sink"], notes["duo_train_window"]) == (SINK, WINDOW)
    options = replace(options, train_sink=3, train_window=20)
    trained = make_plan(model, "duo", 0.5, SINK, WINDOW, options=options, prompts=prompts)
    assert (trained.notes["duo_train_sink"], trained.notes["duo_train_window"]) == (3, 20)
    longer = how.prompts(read_documents(None), bpe, replace(options, prompt_tokens=300), 0)
    with pytest.raises(ProbeError, match=r"^duo's 300-token passkey prompts are longer than the "
                       r"model's 256 positions; use a smaller prompt_tokens\.$"):  # fmt: skip
        make_plan(model, "duo", 0.5, SINK, WINDOW, options={"steps": 1}, prompts=longer)
    # a streaming side that keeps the whole prompt is full attention: nothing to learn
    for sink, window in ((0, 256), (10, 246)):
        with pytest.raises(ProbeError, match="the gates would learn nothing"):
            make_plan(model, "duo", 0.5, sink, window, options={"steps": 1}, prompts=prompts)
    make_plan(model, "duo", 0.5, 10, 245, options={"steps": 1}, prompts=prompts)  # one token out


@pytest.mark.parametrize(("given", "said"), [
    ({"warmup": 0.6}, "warmup must be from 0 to 0.5"),
    ({"warmup": -0.1}, "warmup must be from 0 to 0.5"),
    ({"prompt_tokens": 32}, "prompt_tokens must be at least 64"),
    ({"passkeys": 21}, "passkeys must be at least 1 and at most 20"),
    ({"passkeys": 0}, "passkeys must be at least 1 and at most 20"),
    ({"train_sink": -1}, "train_sink must be at least 0"),
    ({"train_window": -4}, "train_window must be at least 0"),
])  # fmt: skip
def test_bounds_of_the_new_options_are_one_line(given, said):
    with pytest.raises(ProbeError, match=f"^{said}") as info:
        METHODS.get("duo").read(given)
    assert "\n" not in str(info.value)


def test_passkeys_that_crowd_out_the_text_are_one_line(bpe):
    docs = read_documents(None)
    with pytest.raises(ProbeError, match=r"^duo's 128-token passkey prompts leave \d+ tokens of "
                       r"text beside 2 passkeys of 32 words"):  # fmt: skip
        text_passkeys(docs, bpe, 1, 128, passkeys=2, words=32)
    with pytest.raises(ProbeError, match=r"^The text is too short"):
        text_passkeys(["a short text"], bpe, 1, 256, passkeys=1, words=4)
