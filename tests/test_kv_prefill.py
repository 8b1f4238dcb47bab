"""How a prompt enters a key/value plan's cache (`probe.kv.evaluate.Prefill`): the papers' full
prefill then the cut, chunked prefill cut after each chunk, and masked prefill. Each is checked
against a full forward over the whole sequence with an explicit per-query mask written here (a
query at p of a call that began at c sees, in a streaming head, the sink and the keys from
c - window on; a decoded token's call begins at itself), and the cache's peak bytes against
counts by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_kv_apply import plan_of
from test_kv_cache import CONFIGS, tiny

from probe.errors import ProbeError
from probe.kv.evaluate import Prefill, Prefills, prefilled

SEQ, PROMPT = 22, 14
TOKENS = torch.randint(0, 40, (1, SEQ), generator=torch.Generator().manual_seed(5))


class CallMask:
    """A full forward's mask for streaming heads whose cache is cut after each call: a query
    at p sees key j when j < sink or j >= c - w (and j <= p, the causal rule), c = start(p) the
    call's start and w the window once c tokens have arrived: `window`, or with RazorAttention's
    buffer max(window, ceil(c / ratio))."""

    def __init__(self, stream: tuple[int, ...], sink: int, window: int, start,
                 ratio: float = 0.0, compensate: bool = False) -> None:  # fmt: skip
        self.stream, self.sink, self.window, self.start = stream, sink, window, start
        self.ratio, self.compensate = ratio, compensate

    def recent(self, c: int) -> int:
        return max(self.window, math.ceil(c / self.ratio)) if self.ratio else self.window

    def keeps(self, p: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """[q, k]: j < sink, or j at or after the start of p's call minus the window."""
        begins = torch.tensor([self.start(i) - self.recent(self.start(i)) for i in p.tolist()])
        return (j.view(1, -1) < self.sink) | (j.view(1, -1) >= begins.view(-1, 1))

    def visible(self, kv_index, q_len, k_len, visible):
        keeps = self.keeps(torch.arange(k_len - q_len, k_len), torch.arange(k_len))
        streams = torch.isin(kv_index, torch.tensor(self.stream, dtype=torch.long))  # [head]
        heads = keeps.unsqueeze(0) | ~streams.view(-1, 1, 1)  # [head, q, k]
        return heads.unsqueeze(0) if visible is None else visible & heads.unsqueeze(0)


def by_full_forward(model, plan, start) -> torch.Tensor:
    """Logits [seq, vocab] of the whole sequence with every streaming head masked by `start`."""
    masks = [CallMask(r.stream, r.sink, r.window, start, r.ratio, r.compensate)
             if r is not None else None for r in model.stream_rules(plan)]  # fmt: skip
    original = model.stream_rules
    model.stream_rules = lambda _plan, masked=True: masks
    try:
        with torch.no_grad():
            return model(TOKENS, plan=plan)[0]
    finally:
        model.stream_rules = original


def by_cache(model, plan, prefill, kept=None) -> tuple[torch.Tensor, object]:
    """Logits [seq - PROMPT + 1, vocab] at the prompt's last position and each later one: the
    prompt by `prefill`, then one token at a time; and the cache."""
    with torch.no_grad():
        cache, last = prefilled(model, TOKENS[0, :PROMPT], plan, prefill, kept)
        steps = [last.unsqueeze(0)]
        for i in range(PROMPT, SEQ):
            steps.append(model(TOKENS[:, i : i + 1], cache=cache)[0])
    return torch.cat(steps), cache


def model_of(name: str):
    """A tiny model of `CONFIGS[name]` with two key/value heads a site (the plans' shape)."""
    return tiny(**{**CONFIGS[name], "n_kv_head": 2})


PLANS = [plan_of([(), (1,)], sink=2, window=3), plan_of([(0,), ()], sink=0, window=4),
         plan_of([(), ()], sink=1, window=5)]  # fmt: skip


def chunk_start(chunk: int):
    """Where the call of position p began: its chunk's start in the prompt, itself after."""
    return lambda p: p if p >= PROMPT else (p // chunk) * chunk


@pytest.mark.parametrize("name", ["rope-gqa", "alibi", "t5", "window"])
@pytest.mark.parametrize("plan", PLANS, ids=["mixed", "no-sink", "all-stream"])
def test_full_prefill_is_full_attention_then_the_cut(name, plan):
    model = model_of(name)
    got, _ = by_cache(model, plan, Prefill("full"))
    want = by_full_forward(model, plan, chunk_start(PROMPT))[PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # and the prefill is the full model's: the prompt's last logits are the plain forward's
    with torch.no_grad():
        plain = model(TOKENS[:, :PROMPT])[0, -1]
    torch.testing.assert_close(got[0], plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["rope-gqa", "alibi", "fire"])
@pytest.mark.parametrize("chunk", [1, 4, 5, PROMPT])
def test_chunked_prefill_cuts_after_each_chunk(name, chunk):
    model, plan = model_of(name), PLANS[0]
    got, _ = by_cache(model, plan, Prefill("chunked", chunk))
    want = by_full_forward(model, plan, chunk_start(chunk))[PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if chunk == PROMPT:  # one chunk: the full prefill
        full, _ = by_cache(model, plan, Prefill("full"))
        torch.testing.assert_close(got, full, atol=1e-6, rtol=1e-6)


def test_masked_prefill_is_the_masked_full_forward():
    model, plan = model_of("rope-gqa"), PLANS[0]
    got, _ = by_cache(model, plan, Prefill("masked"))
    with torch.no_grad():  # the plan's own mask: sink and window up to each query
        want = model(TOKENS, plan=plan)[0, PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # one token a call, the window counts the cached window and the query: one more than masked
    wider = plan_of([(), (1,)], sink=2, window=4)
    one, _ = by_cache(model, plan, Prefill("chunked", 1))
    with torch.no_grad():
        torch.testing.assert_close(one, model(TOKENS, plan=wider)[0, PROMPT - 1 :],
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("prefill", [Prefill("full"), Prefill("chunked", 3), Prefill("masked")],
                         ids=["full", "chunked", "masked"])  # fmt: skip
def test_razor_buffer_grows_with_the_tokens(prefill):
    """buffer_ratio 2: a streaming head keeps max(window, ceil(n / 2)) recent tokens."""
    model = model_of("rope-gqa")
    plan = dataclasses.replace(PLANS[0], buffer_ratio=2.0)
    got, cache = by_cache(model, plan, prefill)
    if prefill.mode == "masked":  # the plan's own mask, the window growing with the position
        with torch.no_grad():
            want = model(TOKENS, plan=plan)[0, PROMPT - 1 :]
    else:
        chunk = prefill.chunk if prefill.mode == "chunked" else PROMPT
        want = by_full_forward(model, plan, chunk_start(chunk))[PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # after all SEQ = 22 tokens: the 2 sink tokens and the last ceil(22 / 2) = 11
    assert cache.sites[0].kept.tolist() == [0, 1, *range(SEQ - math.ceil(SEQ / 2), SEQ)]
    fixed, _ = by_cache(model, PLANS[0], prefill)
    assert not torch.allclose(got, fixed)  # the buffer changed what the heads saw


def test_peak_bytes_by_hand():
    """2 sites x 2 key/value heads x d_head 8 (rope-gqa), float32: 64 bytes a token and head
    for k and v. Every head streams, sink 1 + window 5 = 6 tokens kept."""
    model, plan = model_of("rope-gqa"), PLANS[2]
    per = 2 * 8 * 4 * 2  # k and v, d_head 8, 4 bytes, 2 key/value heads
    _, full = by_cache(model, plan, Prefill("full"))
    assert full.peak_nbytes == 2 * PROMPT * per  # the prefill held the whole prompt everywhere
    _, masked = by_cache(model, plan, Prefill("masked"))
    # site 0 cut to 6 while site 1 holds the whole prompt
    assert masked.peak_nbytes == (6 + PROMPT) * per
    _, chunked = by_cache(model, plan, Prefill("chunked", 4))
    assert chunked.peak_nbytes == (6 + 6 + 4) * per  # one site holds its 6 and a chunk of 4
    for cache in (full, masked, chunked):  # after decoding every cache holds sink + window
        assert cache.nbytes == 2 * 6 * per


def test_a_kept_prefill_is_reused_and_never_grows():
    model, plan = model_of("rope-gqa"), PLANS[0]
    kept = Prefills(budget=2**30)
    first, _ = by_cache(model, plan, Prefill("full"), kept)
    (cache, _), = kept._kept.values()  # fmt: skip
    held = cache.nbytes
    again, _ = by_cache(model, None, Prefill("full"), kept)  # the full cache, from the same
    assert cache.nbytes == held and cache.length == PROMPT and len(kept._kept) == 1
    alone, _ = by_cache(model, plan, Prefill("full"))
    torch.testing.assert_close(first, alone, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(again, model(TOKENS)[0, PROMPT - 1 :], atol=1e-5, rtol=1e-5)
    small = Prefills(budget=1)  # over its budget: made each time, kept never
    by_cache(model, plan, Prefill("full"), small)
    assert small.held == 0 and not small._kept


@pytest.mark.parametrize("mode, chunk", [("all", 4), ("chunked", 0), ("chunked", True)])
def test_bad_prefills_are_one_line(mode, chunk):
    with pytest.raises(ProbeError, match="prefill"):
        Prefill(mode, chunk)


@pytest.mark.parametrize("text", ["partial", "masked:4", "chunked:", "chunked:0", "chunked:x"])
def test_the_prefill_flag_is_checked_before_loading(text):
    from probe_cli.kv_eval import parse_prefill

    with pytest.raises(ProbeError, match="--prefill"):
        parse_prefill(text)
    assert parse_prefill("chunked:64") == Prefill("chunked", 64)
    assert parse_prefill(None) == Prefill("full")


def test_the_compensation_token_by_its_formula():
    """attn = (n e^(q.k_c) v_c + sum_kept e^(q.k_i) v_i) / (n e^(q.k_c) + sum_kept e^(q.k_i)),
    k_c and v_c the dropped keys' and values' means, written out query by query."""
    from probe.model.compensate import compensated

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g) for _ in range(3))
    gone = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    gone[..., 2, 0] = gone[..., 3, 0] = gone[..., 3, 1] = True  # query 3 lost keys 0 and 1
    seen = torch.ones(4, 4).tril().bool().view(1, 1, 4, 4) & ~gone
    before = (torch.randn(1, 2, 3, generator=g), torch.randn(1, 2, 3, generator=g), 5)
    got = compensated(q, k, v, seen, gone, before)
    for h in range(2):
        for i in range(4):
            lost = [j for j in range(4) if gone[0, 0, i, j]]
            n = 5 + len(lost)
            k_c = (before[0][0, h] + sum((k[0, h, j] for j in lost), torch.zeros(3))) / n
            v_c = (before[1][0, h] + sum((v[0, h, j] for j in lost), torch.zeros(3))) / n
            kept = [j for j in range(4) if seen[0, 0, i, j]]
            w = [torch.exp(q[0, h, i] @ k[0, h, j]) for j in kept]
            spread = sum(wj * v[0, h, j] for wj, j in zip(w, kept, strict=True))
            top = n * torch.exp(q[0, h, i] @ k_c) * v_c + spread
            want = top / (n * torch.exp(q[0, h, i] @ k_c) + sum(w))
            torch.testing.assert_close(got[0, h, i], want, atol=1e-5, rtol=1e-5)
    causal = torch.ones(4, 4).tril().bool()
    alone = compensated(q, k, v, causal.view(1, 1, 4, 4), None, None)
    plain = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~causal, float("-inf")), -1) @ v
    torch.testing.assert_close(alone, plain, atol=1e-6, rtol=1e-6)  # nothing dropped: attention


COMPENSATING = dataclasses.replace(PLANS[0], compensate=True)


@pytest.mark.parametrize("prefill", [Prefill("full"), Prefill("chunked", 4)],
                         ids=["full", "chunked"])  # fmt: skip
def test_compensated_cache_cut_after_each_call(prefill):
    model = model_of("rope-gqa")
    got, cache = by_cache(model, COMPENSATING, prefill)
    chunk = prefill.chunk if prefill.mode == "chunked" else PROMPT
    want = by_full_forward(model, COMPENSATING, chunk_start(chunk))[PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    plain, _ = by_cache(model, PLANS[0], prefill)
    assert not torch.allclose(got, plain)  # the token changed what the heads saw
    sums = cache.sites[0].dropped  # every key but the sink and window was folded in
    assert sums[2] == SEQ - 2 - 3 and sums[0].shape == (1, 2, 8)


def test_compensated_masked_cache_is_the_masked_full_forward():
    model = model_of("rope-gqa")
    got, _ = by_cache(model, COMPENSATING, Prefill("masked"))
    with torch.no_grad():
        want = model(TOKENS, plan=COMPENSATING)[0, PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_compensation_is_refused_where_it_has_no_position():
    plan = dataclasses.replace(PLANS[0], compensate=True)
    with pytest.raises(ProbeError, match="compensation token"):
        model_of("alibi").new_cache(plan)
