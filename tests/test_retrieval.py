"""Retrieval heads: the needle prompts say what they claim, and the score is recomputed from the
full attention weights by an independent loop."""

from __future__ import annotations

import pytest
import torch

from probe.analysis.retrieval import needle_prompts, retrieval_scores
from probe.config import ModelConfig
from probe.model import Transformer
from probe.text import read_documents

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


@pytest.mark.parametrize("require_copy", [True, False])
def test_score_equals_a_direct_count(require_copy):
    tok = tokenizer()
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=tok.get_vocab_size(), n_layer=2, n_head=4,
                                    d_model=32, pe="rope", max_len=256)).eval()  # fmt: skip
    with torch.no_grad():  # sharp attention, so argmax hits happen
        for block in model.blocks:
            block.attn.q.weight.mul_(8.0)
    prompts = needle_prompts(read_documents(None), tok, 4, 60, seed=2)
    table = retrieval_scores(model, prompts, require_copy=require_copy)
    hits = torch.zeros(2, 4)
    counted = right = total = 0
    for p in prompts:
        w = Weights()
        with torch.no_grad(), model.observe(w):
            logits = model(p.tokens.unsqueeze(0))[0]
        for j, step in enumerate(p.answer_steps.tolist()):
            ok = int(logits[step].argmax()) == int(p.answer[j])
            right += ok
            total += 1
            if require_copy and not ok:
                continue
            counted += 1
            for layer in range(2):
                for head in range(4):
                    top = int(w.probs[layer][head, step].argmax())
                    hits[layer, head] += top == int(p.sources[j])
    for r in table.itertuples():
        assert abs(r.score - float(hits[r.layer, r.head]) / max(counted, 1)) < 1e-12
    assert table.steps.iloc[0] == counted
    assert abs(table.copy_accuracy.iloc[0] - right / total) < 1e-12


class Scripted:
    """A stand-in model with scripted attention and predictions: head 0 always looks at the
    needle token being copied, head 1 at position 0; it predicts the answer on even steps."""

    def __init__(self, prompt):
        self.p, self.observer, self.training = prompt, None, False
        self.param = torch.nn.Parameter(torch.zeros(1))

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

        n = tokens.shape[1]
        probs = torch.zeros(1, 2, n, n)
        probs[0, 1, :, 0] = 1.0
        for j, step in enumerate(self.p.answer_steps.tolist()):
            probs[0, 0, step, int(self.p.sources[j])] = 1.0
        z = torch.zeros(1, 2, n, 4)
        call = AttentionCall(Site("blocks.0.attn", 0, False, True, 2, 2, (0, 1)), z, z, z,
                             torch.ones(2), None, None, None, probs=probs)  # fmt: skip
        self.observer.record(call)
        logits = torch.zeros(1, n, 1000)
        for j, step in enumerate(self.p.answer_steps.tolist()):
            logits[0, step, int(self.p.answer[j]) if j % 2 == 0 else 999] = 1.0
        return logits


def test_scripted_heads_score_one_and_zero():
    prompt = needle_prompts(read_documents(None), tokenizer(), 1, 60, seed=3)[0]
    table = retrieval_scores(Scripted(prompt), [prompt]).set_index("head")
    k = len(prompt.answer)
    assert table.loc[0, "score"] == 1.0 and table.loc[1, "score"] == 0.0
    assert table.loc[0, "steps"] == (k + 1) // 2  # only the steps it copied
    assert abs(table.loc[0, "copy_accuracy"] - ((k + 1) // 2) / k) < 1e-12
