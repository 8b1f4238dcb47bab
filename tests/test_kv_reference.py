"""probe's key/value plans against an independent implementation of the papers' protocol
(benchmarks/kv_reference.py: transformers' own Llama with an attention function that masks, per
key/value head, the keys a streaming head has evicted, over a full DynamicCache). On a tiny
grouped-query Llama checkpoint saved by transformers and imported into probe, the per-step
logits of a prompt prefilled in full (or in chunks), then decoded one token at a time through
the cache, agree within 1e-4 for mixed, all-streaming and sink-0 plans, and greedy decodes are
the same tokens. The comparison is sharp: the plan moves the logits far more than the
tolerance, and a window one token shorter (the masked convention for a decoded token) is told
apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from probe.analysis.retrieval import NeedlePrompt
from probe.interop.importer import import_model
from probe.kv.evaluate import Prefill, decode_needle, prefilled
from probe.kv.plan import KVPlan

transformers = pytest.importorskip("transformers")

VOCAB, PROMPT, STEPS, SINK, WINDOW, CHUNK = 64, 40, 10, 2, 6, 7
PLANS = {  # per layer the key/value heads that keep the full cache (2 per layer)
    "mixed": [{0}, {1}, set()],
    "every head streaming": [set(), set(), set()],
    "mixed, sink 0": [{1}, set(), {0}],
}
SINKS = {"mixed, sink 0": 0}
MODES = [None, CHUNK]  # full prefill, chunked prefill


def _reference():
    """benchmarks/kv_reference.py, a script (benchmarks/ is not a package), as a module."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kv_reference.py"
    spec = importlib.util.spec_from_file_location("kv_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ref = _reference()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(the transformers model, the same checkpoint imported into probe), float32."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=96, max_position_embeddings=128,
                                   tie_word_embeddings=False)  # fmt: skip
    with torch.random.fork_rng():  # the random init, without touching the global generator
        torch.manual_seed(0)
        hf = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper attention than the default init's near-uniform one
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
        hf.lm_head.weight.mul_(4.0)
    path = tmp_path_factory.mktemp("kv-reference") / "llama"
    hf.save_pretrained(path)
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return hf, import_model(path, dtype="float32").model.eval()


TOKENS = torch.randint(0, VOCAB, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(1))


def probe_plan(full: list[set[int]], sink: int, window: int = WINDOW) -> KVPlan:
    return KVPlan("random", 0.5, sink, window, tuple(tuple(sorted(f)) for f in full))


@torch.no_grad()
def probe_logits(model, plan, chunk: int | None) -> torch.Tensor:
    """[STEPS, vocab]: the prompt prefilled by probe's protocol, then TOKENS fed one at a
    time through its cache (teacher-forced)."""
    prefill = Prefill("chunked", chunk) if chunk else Prefill("full")
    cache, logits = prefilled(model, TOKENS[:PROMPT], plan, prefill)
    steps = [logits]
    for t in TOKENS[PROMPT : PROMPT + STEPS - 1]:
        steps.append(model(t.view(1, 1), cache=cache)[0, -1])
    return torch.stack(steps).float()


def reference_logits(hf, full, sink, chunk, window=WINDOW) -> torch.Tensor:
    forced = TOKENS[PROMPT : PROMPT + STEPS - 1]
    _, logits = ref.reference_decode(hf, TOKENS[:PROMPT], full, sink, window, STEPS, chunk,
                                     forced)  # fmt: skip
    return logits


@pytest.mark.parametrize("chunk", MODES, ids=["full", "chunked"])
@pytest.mark.parametrize("name", list(PLANS))
def test_per_step_logits_match_the_reference(models, name, chunk):
    hf, model = models
    full, sink = PLANS[name], SINKS.get(name, SINK)
    ours = probe_logits(model, probe_plan(full, sink), chunk)
    theirs = reference_logits(hf, full, sink, chunk)
    assert (ours - theirs).abs().max() < 1e-4
    # the plan matters here: its logits stand far from the full cache's
    whole = reference_logits(hf, [{0, 1}] * 3, sink, chunk)
    assert (theirs - whole).abs().max() > 1e-2


def test_the_reference_with_every_head_full_is_the_plain_model(models):
    """With no streaming head the custom attention is transformers' own eager model."""
    hf, _ = models
    theirs = reference_logits(hf, [{0, 1}] * 3, SINK, None)
    with torch.no_grad():
        plain = hf(TOKENS[: PROMPT + STEPS - 1].view(1, -1)).logits[0, PROMPT - 1 :]
    assert (theirs - plain).abs().max() < 1e-4


@pytest.mark.parametrize("chunk", MODES, ids=["full", "chunked"])
def test_a_window_one_token_shorter_is_told_apart(models, chunk):
    """A decoded token sees the window before it and itself: the masked convention (the window
    up to itself, one key fewer) gives other logits, so the comparison above would catch it."""
    hf, model = models
    full = PLANS["mixed"]
    ours = probe_logits(model, probe_plan(full, SINK), chunk)
    shorter = reference_logits(hf, full, SINK, chunk, window=WINDOW - 1)
    assert (ours - shorter).abs().max() > 1e-3


def test_the_chunked_prefill_is_not_the_full_one(models):
    """The chunks' cuts reach the prompt's last position: the two protocols are told apart."""
    hf, _ = models
    full = PLANS["mixed"]
    chunked = reference_logits(hf, full, SINK, CHUNK)
    assert (chunked - reference_logits(hf, full, SINK, None)).abs().max() > 1e-2


@pytest.mark.parametrize("chunk", MODES, ids=["full", "chunked"])
@pytest.mark.parametrize("name", list(PLANS))
def test_greedy_decodes_are_the_same_tokens(models, name, chunk):
    hf, model = models
    full, sink = PLANS[name], SINKS.get(name, SINK)
    theirs, _ = ref.reference_decode(hf, TOKENS[:PROMPT], full, sink, WINDOW, STEPS, chunk)
    # decode_needle decodes len(answer) tokens after tokens[: answer_steps[0] + 1]
    needle = NeedlePrompt(TOKENS, torch.arange(PROMPT - 1, PROMPT - 1 + STEPS),
                          torch.zeros(STEPS, dtype=torch.long),
                          torch.zeros(STEPS, dtype=torch.long))  # fmt: skip
    prefill = Prefill("chunked", chunk) if chunk else Prefill("full")
    ours, _, _ = decode_needle(model, needle, probe_plan(full, sink), prefill)
    assert torch.equal(ours, theirs)
    # the plan changes the greedy output, so the two agreeing says something
    whole, _ = ref.reference_decode(hf, TOKENS[:PROMPT], [{0, 1}] * 3, sink, WINDOW, STEPS, chunk)
    assert not torch.equal(theirs, whole)
