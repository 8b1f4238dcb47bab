"""Applying a key/value plan: incremental decoding through the evicting cache equals the full
forward with the plan's masks (GQA, rotary, ALiBi, T5, sliding windows, soft-capping, QK-norm);
a plan with every head full is no plan; the bytes a cache allocates are what sink + window and
the full heads predict, counted by hand."""

from __future__ import annotations

import pytest
import torch
from test_kv_cache import CONFIGS, tiny

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.kv.plan import KVPlan
from probe.model import Transformer

SEQ, PROMPT = 15, 6


def plan_of(full, sink=2, window=3, method="random") -> KVPlan:
    return KVPlan(method, 0.5, sink, window, tuple(tuple(f) for f in full))


def decode(model, tokens, prompt, plan):
    """Logits [batch, seq, vocab]: prefill `prompt` tokens, then one token at a time."""
    cache = model.new_cache(plan)
    with torch.no_grad():
        steps = [model(tokens[:, :prompt], cache=cache)]
        for i in range(prompt, tokens.shape[1]):
            steps.append(model(tokens[:, i : i + 1], cache=cache))
    return torch.cat(steps, dim=1), cache


TOKENS = torch.randint(0, 40, (2, SEQ), generator=torch.Generator().manual_seed(3))
MODELS = [
    "rope-gqa",
    "alibi",
    "t5",
    "fire",
    "window",
    "gemma2-like",
    "olmo2-like",
    "neox-like",
    "log-length",
]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("full", [((0,), ()), ((), (1,)), ((), ())])
def test_evicting_cache_equals_the_masked_full_forward(name, full):
    model = tiny(**CONFIGS[name])
    groups = model.cfg.kv_heads
    full = tuple(tuple(g for g in f if g < groups) for f in full)
    plan = plan_of(full)
    with torch.no_grad():
        masked = model(TOKENS, plan=plan)
        plain = model(TOKENS)
    cached, _ = decode(model, TOKENS, PROMPT, plan)
    assert float((cached - masked).abs().max()) <= 1e-5
    # the plan hides keys here (sink 2 + window 3 < 15 tokens): the masks change the logits
    assert float((masked - plain)[:, -1].abs().max()) > 1e-3


def test_a_streaming_query_sees_exactly_sink_and_window():
    """Independently of the masks: in a one-layer model without positional encoding whose every
    head streams, position p's logits are the last logits of a plain forward over just the
    tokens it keeps (the first `sink` and the last `window` up to p)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, n_layer=1, n_head=4, n_kv_head=2, d_model=32, pe="none")
    model = Transformer(cfg).eval()
    sink, window = 2, 4
    plan = plan_of([()], sink, window, "streaming")
    cached, _ = decode(model, TOKENS, 9, plan)
    with torch.no_grad():
        for p in range(SEQ):
            kept = [j for j in range(p + 1) if j < sink or p - j < window]
            alone = model(TOKENS[:, kept])[:, -1]  # [batch, vocab]
            assert float((cached[:, p] - alone).abs().max()) <= 1e-5, p


@pytest.mark.parametrize("name", ["rope-gqa", "alibi", "gemma2-like"])
def test_every_head_full_is_no_plan_exactly(name):
    model = tiny(**CONFIGS[name])
    plan = plan_of([range(model.cfg.kv_heads)] * 2, method="full")
    with torch.no_grad():
        assert torch.equal(model(TOKENS, plan=plan), model(TOKENS))
    with_plan, cache = decode(model, TOKENS, PROMPT, plan)
    without, plain = decode(model, TOKENS, PROMPT, None)
    assert torch.equal(with_plan, without)
    assert cache.nbytes == plain.nbytes


def test_every_head_streaming_allocates_sink_plus_window():
    model = tiny(**CONFIGS["rope-gqa"])  # 2 sites, 2 kv heads of 8 dims, float32
    sink, window, batch, length = 4, 5, 2, 40
    tokens = torch.randint(0, 40, (batch, length), generator=torch.Generator().manual_seed(5))
    _, cache = decode(model, tokens, 30, plan_of([(), ()], sink, window, "streaming"))
    d_head, kv, sites, floats = 8, 2, 2, 4
    assert cache.nbytes == sites * 2 * batch * kv * (sink + window) * d_head * floats
    _, full = decode(model, tokens, 30, None)
    assert full.nbytes == sites * 2 * batch * kv * length * d_head * floats


def test_a_mixed_plan_allocates_full_heads_and_windows():
    model = tiny(**CONFIGS["rope-gqa"])
    sink, window, batch, length = 1, 6, 1, 33
    tokens = torch.randint(0, 40, (batch, length), generator=torch.Generator().manual_seed(6))
    _, cache = decode(model, tokens, 20, plan_of([(1,), ()], sink, window))
    per_token = 2 * batch * 8 * 4  # k and v of one kv head, float32
    site0 = per_token * (length + sink + window)  # head 1 full, head 0 streaming
    site1 = per_token * 2 * (sink + window)  # both streaming
    assert cache.nbytes == site0 + site1
    assert cache.sites[0].nbytes == site0


def test_a_short_sequence_keeps_everything():
    """Fewer tokens than sink + window: nothing is evicted and the plan changes nothing."""
    model = tiny(**CONFIGS["alibi"])
    tokens = TOKENS[:, :5]
    plan = plan_of([(), ()], sink=2, window=3)
    cached, cache = decode(model, tokens, 2, plan)
    with torch.no_grad():
        assert float((cached - model(tokens)).abs().max()) <= 1e-5
    assert cache.sites[0].kept.tolist() == [0, 1, 2, 3, 4]


def test_plans_that_do_not_fit_are_one_line():
    model = tiny(**CONFIGS["rope-gqa"])
    with pytest.raises(ProbeError, match="the model has 2"):
        model.new_cache(plan_of([()]))
    with pytest.raises(ProbeError, match="no key/value heads"):
        model.new_cache(plan_of([(5,), ()]))
    with pytest.raises(ProbeError, match="window >= 1"):
        plan_of([(), ()], window=0)
    encoder = tiny(arch="encoder")
    with pytest.raises(ProbeError, match="applies to decoders"):
        encoder.new_cache(plan_of([(), ()]))


def _greedy_by_full_forward(model, prompt, plan):
    """The needle decoded greedily by the full forward over the whole sequence at every step."""
    start, k = int(prompt.answer_steps[0]) + 1, len(prompt.answer)
    seq = prompt.tokens[:start]
    out = []
    with torch.no_grad():
        for _ in range(k):
            token = int(model(seq.unsqueeze(0), plan=plan)[0, -1].argmax())
            out.append(token)
            seq = torch.cat([seq, torch.tensor([token])])
    return out


def _needle_setup():
    from test_retrieval import tokenizer

    from probe.analysis.retrieval import needle_prompts
    from probe.data.text import read_documents

    tok = tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), n_layer=2, n_head=4, n_kv_head=2,
                      d_model=32, pe="rope", max_len=256)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharp attention: the heads' choices matter
        for block in model.blocks:
            block.attn.q.weight.mul_(8.0)
    return model, tok, needle_prompts(read_documents(None), tok, 3, 80, seed=4)


def test_needle_decoding_through_the_evicting_cache_is_the_masked_greedy_decoding():
    from probe.kv.evaluate import Prefill, decode_needle, needle_rows

    model, _, prompts = _needle_setup()
    streaming = plan_of([(), (0,)], sink=2, window=8, method="streaming")
    masked = Prefill("masked")
    for plan in (None, streaming):
        for p in prompts:
            generated, _, _ = decode_needle(model, p, plan, masked)
            assert generated.tolist() == _greedy_by_full_forward(model, p, plan)
    rows = needle_rows(model, prompts, streaming, prefill=masked)
    accuracy = [r["value"] for r in rows if r["metric"] == "needle_accuracy"]
    by_hand = sum(
        sum(a == b for a, b in zip(_greedy_by_full_forward(model, p, streaming),
                                   p.answer.tolist(), strict=True)) / len(p.answer)
        for p in prompts
    ) / len(prompts)  # fmt: skip
    assert accuracy == [pytest.approx(by_hand)]


def test_needle_accuracy_with_every_head_full_equals_no_plan():
    from probe.kv.evaluate import needle_rows

    model, _, prompts = _needle_setup()
    full = plan_of([(0, 1), (0, 1)], method="full")
    assert needle_rows(model, prompts, full) == needle_rows(model, prompts, None)
    streaming = plan_of([(), ()], sink=2, window=8, method="streaming")
    cut = {r["metric"]: r["value"] for r in needle_rows(model, prompts, streaming)}
    whole = {r["metric"]: r["value"] for r in needle_rows(model, prompts, None)}
    assert cut["kv_bytes"] == 2 * 2 * 2 * (2 + 8) * 8 * 4  # sites, k and v, kv heads, d_head
    assert whole["kv_bytes"] > 4 * cut["kv_bytes"]
