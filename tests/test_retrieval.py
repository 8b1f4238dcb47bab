"""Retrieval heads: the needle prompts say what they claim, and the score is recomputed from the
full attention weights by an independent loop."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from probe.analysis.retrieval import NeedlePrompt, needle_prompts, retrieval_scores
from probe.config import ModelConfig
from probe.data.text import read_documents
from probe.model import Transformer

tokenizers = pytest.importorskip("tokenizers")


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for d in read_documents(None) for w in d.split()})[:400]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    for w in ("The", "secret", "passphrase", "is", "What", "is", "the", "passphrase?"):
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


class Weights:
    needs_weights = True

    def __init__(self):
        self.probs = {}

    def record(self, call):
        self.probs[call.layer] = call.probs[0].clone()  # [head, q, k]


def test_prompts_point_at_the_needle():
    tok = tokenizer()
    for p in needle_prompts(read_documents(None), tok, 3, 120, seed=1):
        assert torch.equal(p.tokens[p.answer_steps + 1], p.answer)  # each step predicts it
        assert torch.equal(p.tokens[p.sources], p.answer)  # and the needle holds it
        assert int(p.sources.max()) < int(p.answer_steps.min())  # the needle comes first
        assert abs(len(p.tokens) - 120) <= 1


@pytest.mark.parametrize("bias", [0.25, 0.3])
def test_score_equals_a_direct_greedy_count(bias):
    """Wu et al.'s score recomputed by a plain greedy loop: one full forward pass per decoding
    step (no shortcut through the teacher-forced pass), hits counted from the full weights. The
    test tokenizer maps the needle's words to [UNK] (id 0) and a bias on that id makes the model
    emit it: at 0.3 it copies every needle; at 0.25 it misses the first token and, decoding on
    from its own output, no longer copies (teacher-forced it would be 5 of 6 right)."""
    tok = tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), n_layer=2, n_head=4, d_model=32,
                      pe="rope", max_len=256, head_bias=True)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharp attention, so argmax hits happen
        for block in model.blocks:
            block.attn.q.weight.mul_(8.0)
        model.head.bias[0] = bias
    prompts = needle_prompts(read_documents(None), tok, 4, 60, seed=2)
    table = retrieval_scores(model, prompts)
    sums, retrieved, recalls = torch.zeros(2, 4), 0, []
    for p in prompts:
        k, start = len(p.answer), int(p.answer_steps[0]) + 1
        seq = p.tokens[:start].clone()
        hits = torch.zeros(2, 4)
        out = []
        for _ in range(k):
            w = Weights()
            with torch.no_grad(), model.observe(w):
                token = int(model(seq.unsqueeze(0))[0, -1].argmax())
            for layer in range(2):
                for head in range(4):
                    top = int(w.probs[layer][head, -1].argmax())
                    inside = int(p.sources[0]) <= top <= int(p.sources[-1])
                    hits[layer, head] += inside and int(seq[top]) == token
            out.append(token)
            seq = torch.cat([seq, torch.tensor([token])])
        left = p.answer.tolist()
        for t in out:
            if t in left:
                left.remove(t)
        recall = 1 - len(left) / k
        recalls.append(recall)
        if recall > 0.5:
            retrieved += 1
            sums += hits / k
    assert table.prompts.iloc[0] == retrieved
    if bias == 0.3:  # the check is not vacuous
        assert retrieved == len(prompts) and (table.value > 0).any()
    else:  # greedy differs from teacher forcing: it copies nothing
        assert retrieved == 0 and table.value.isna().all() and table.recall.iloc[0] == 0
        assert table.copy_accuracy.iloc[0] == pytest.approx(5 / 6)
    assert table.recall.iloc[0] == pytest.approx(sum(recalls) / len(recalls))
    for r in table.itertuples():
        expected = float(sums[r.layer, r.head]) / retrieved if retrieved else float("nan")
        assert r.value == pytest.approx(expected, nan_ok=True)


class Scripted:
    """A stand-in causal model with scripted attention and predictions: head 0 always looks at
    the needle position of the answer token of the current step, head 1 at position 0; it
    predicts the answer token at every step but those in `wrong`, where it predicts 999 (not in
    the needle). What it computes at a position depends only on the position (so on the prefix),
    as in a causal model."""

    def __init__(self, prompt, wrong=(1,)):
        self.p, self.wrong, self.observer, self.training = prompt, set(wrong), None, False
        self.param = torch.nn.Parameter(torch.zeros(1))
        self.calls = 0

    def parameters(self):
        yield self.param

    def eval(self):
        return self

    def train(self, flag):
        return self

    def observe(self, observer):
        from contextlib import contextmanager

        @contextmanager
        def scope():
            self.observer = observer
            yield observer
            self.observer = None

        return scope()

    def __call__(self, tokens):
        from probe.model import AttentionCall
        from probe.site import Site

        self.calls += 1
        n = tokens.shape[1]
        probs = torch.zeros(1, 2, n, n)
        probs[0, 1, :, 0] = 1.0
        logits = torch.zeros(1, n, 1000)
        for j, step in enumerate(self.p.answer_steps.tolist()):
            if step < n:
                probs[0, 0, step, int(self.p.sources[j])] = 1.0
                logits[0, step, 999 if j in self.wrong else int(self.p.answer[j])] = 1.0
        z = torch.zeros(1, 2, n, 4)
        call = AttentionCall(Site("blocks.0.attn", 0, False, True, 2, 2, (0, 1)), z, z, z,
                             torch.ones(2), None, None, None, probs=probs)  # fmt: skip
        self.observer.record(call)
        return logits

    def features(self, tokens):  # its "hidden states" are its logits; the head is the identity
        return self(tokens)

    def logits(self, hidden):
        return hidden


def hand_prompt(k: int = 5) -> NeedlePrompt:
    """Haystack ids 0..9, the needle's k tokens (ids 100..) at positions 10.., filler 20..29,
    then the answer: every token distinct, so a hit is unambiguous."""
    needle = list(range(100, 100 + k))
    ids = list(range(10)) + needle + list(range(20, 30)) + needle
    start = len(ids) - k
    return NeedlePrompt(torch.tensor(ids), torch.arange(start - 1, start - 1 + k),
                        torch.tensor(needle), torch.arange(10, 10 + k))  # fmt: skip


def test_scripted_heads_by_hand():
    """By hand: head 0 hits at every step whose generated token is the needle's (k - 1 of k with
    one wrong step), so Wu's score is (k - 1) / k; the teacher-forced variant divides by the k - 1
    copied steps and reads 1.0, inflated by 1 / copy accuracy."""
    prompt = hand_prompt(5)
    k = len(prompt.answer)
    model = Scripted(prompt)
    table = retrieval_scores(model, [prompt]).set_index("head")
    assert table.loc[0, "value"] == pytest.approx((k - 1) / k)
    assert table.loc[1, "value"] == 0.0
    assert table.loc[0, "copy_accuracy"] == pytest.approx((k - 1) / k)
    assert table.loc[0, "score_teacher_forced"] == 1.0  # hits / copied steps
    assert table.loc[0, "score_teacher_forced"] == pytest.approx(
        table.loc[0, "value"] / table.loc[0, "copy_accuracy"]
    )
    assert table.loc[0, "recall"] == pytest.approx((k - 1) / k)
    assert table.loc[0, "prompts"] == 1
    # greedy decoding reads the teacher pass up to the first wrong token, then one pass a step
    assert model.calls == 1 + (k - 2)


def test_a_prompt_the_model_does_not_retrieve_is_not_counted():
    """Wu et al. accumulate only the prompts whose output recalls more than half the needle."""
    prompts = [hand_prompt(4)]
    k = len(prompts[0].answer)
    bad = Scripted(prompts[0], wrong=range(k))  # recalls nothing
    assert retrieval_scores(bad, [prompts[0]]).set_index("head").loc[0, "prompts"] == 0
    assert pd.isna(retrieval_scores(bad, [prompts[0]]).set_index("head").loc[0, "value"])
    good = retrieval_scores(Scripted(prompts[0], wrong=()), [prompts[0]])
    assert good.set_index("head").loc[0, "value"] == 1.0
