"""DuoAttention's gates: the mixed forward is the plain forward at gates 1 and the all-streaming
masked forward at gates 0 (exactly), and alpha * full + (1 - alpha) * streaming per head in
between (recomputed from the two forwards' head outputs); only the gates get gradients; the
planted long-range echo head's key/value group ends with the highest gate; the CLI writes a plan
KVPlan.read accepts, training on passkeys in text; bad options are one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from cli_run import exit_code
from test_kv_plan import PLANT, planted

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.kv.duo import duo_gates, mixed_features, mixing, streaming_plan
from probe.kv.methods.duo import DuoSettings
from probe.kv.plan import KVPlan
from probe.kv.planning import make_plan
from probe.model import Transformer

SINK, WINDOW = 2, 8


def loud_plant() -> Transformer:
    """test_kv_plan's planted echo head (layer 1, query head 3, key/value group 1) with its
    output projection scaled up, so the head's long-range echo shows in the last hidden state."""
    model = planted()
    layer, head = PLANT
    d = model.cfg.d_head
    with torch.no_grad():
        model.blocks[layer].attn.o.weight[:, head * d : (head + 1) * d] *= 100.0
    return model


def gqa_rope() -> Transformer:
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=50, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pe="rope",
                      max_len=64, qk_norm=True)  # fmt: skip
    return Transformer(cfg).eval()


@pytest.mark.parametrize("make", [planted, gqa_rope])
def test_gates_one_and_zero_are_the_plain_and_streaming_forwards_exactly(make):
    model = make()
    tokens = torch.randint(
        0, model.cfg.vocab_size, (2, 30), generator=torch.Generator().manual_seed(0)
    )
    n = [len(b.attn.site.kept_groups) for b in model.blocks]
    with torch.no_grad():
        plain = model.features(tokens)
        stream = model.features(tokens, plan=streaming_plan(model, SINK, WINDOW))
        ones = mixed_features(model, tokens, [torch.ones(k) for k in n], SINK, WINDOW)
        zeros = mixed_features(model, tokens, [torch.zeros(k) for k in n], SINK, WINDOW)
    assert torch.equal(ones, plain) and torch.equal(zeros, stream)
    assert not torch.allclose(plain, stream)  # the window matters at 30 tokens
    assert all(b.attn.points is None for b in model.blocks)  # restored


class HeadOut:
    needs_weights = False

    def __init__(self):
        self.out = {}

    def record(self, call):
        self.out[call.layer] = call.head_out.clone()  # [batch, head, q, d_head], after gate


def test_mixed_head_output_is_the_gate_weighted_sum():
    """One site mixed (others at gate 1): its head outputs, recovered by inverting W_O's input
    from the observed plain and streaming runs, combine as alpha * full + (1 - alpha) * stream."""
    model = gqa_rope()
    tokens = torch.randint(0, 50, (1, 24), generator=torch.Generator().manual_seed(2))
    alpha = torch.tensor([0.3, 0.8])
    captured = {}
    attn = model.blocks[0].attn
    hook = attn.o.register_forward_hook(lambda m, i, o: captured.setdefault("x", []).append(i[0]))
    with torch.no_grad():
        model.features(tokens)
        model.features(tokens, plan=streaming_plan(model, SINK, WINDOW))
        mixed_features(model, tokens, [alpha, torch.ones(2)], SINK, WINDOW)
    hook.remove()
    full, stream, mixed = captured["x"]  # [1, q, head * d_head] each: W_O's input
    d = model.cfg.d_head
    per_head = alpha.index_select(0, attn.kv_index).repeat_interleave(d)  # [head * d_head]
    expected = per_head * full + (1 - per_head) * stream
    torch.testing.assert_close(mixed, expected, rtol=1e-5, atol=1e-6)


def test_gradients_reach_the_gates_only():
    model = gqa_rope()
    tokens = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(3))
    alphas = [torch.full((2,), 0.5, requires_grad=True) for _ in model.blocks]
    flags = [p.requires_grad for p in model.parameters()]
    assert any(flags)
    mixed_features(model, tokens, alphas, SINK, WINDOW).pow(2).sum().backward()
    assert all(a.grad is not None and a.grad.abs().sum() > 0 for a in alphas)
    assert all(p.grad is None for p in model.parameters())
    assert [p.requires_grad for p in model.parameters()] == flags  # restored after


def test_the_planted_long_range_head_gets_the_highest_gate_and_runs_are_deterministic():
    model = loud_plant()
    settings = DuoSettings(steps=30, l1=1e-3)
    alphas, notes = duo_gates(model, SINK, WINDOW, settings, seed=0)
    again, _ = duo_gates(model, SINK, WINDOW, settings, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(alphas, again, strict=True))
    flat = {(layer, g): float(a[g]) for layer, a in enumerate(alphas) for g in range(len(a))}
    best = max(flat, key=flat.get)
    assert best == (1, 1) and flat[best] > 0.5  # the plant's group
    assert sorted(flat.values())[-2] < flat[best] - 0.3
    assert all(0.0 <= v <= 1.0 for v in flat.values())
    assert notes["duo_prompt_tokens"] == SINK + 2 * WINDOW + 2 * settings.key_len
    result = make_plan(model, "duo", 0.25, SINK, WINDOW, options=settings)  # 1 of 4 key/value heads
    assert result.plan.full == ((), (1,))
    assert result.scores["value"].tolist() == pytest.approx([flat[k] for k in sorted(flat)])
    heads = result.heads.set_index(["layer", "head"])["value"]
    assert heads[PLANT] == pytest.approx(flat[best]) and heads[(1, 2)] == heads[PLANT]  # group


def test_bad_settings_and_observed_mixing_are_refused():
    model = planted()
    with pytest.raises(ProbeError, match=r"^steps must be at least 1 "):
        make_plan(model, "duo", 0.5, SINK, WINDOW, options={"steps": 0})
    with pytest.raises(ProbeError, match="positions"):
        learned = ModelConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, pe="learned",
                              max_len=64)  # fmt: skip
        make_plan(Transformer(learned), "duo", 0.5, SINK, 30, options={"steps": 1})  # 78 > 64
    observed = model.observe(HeadOut())
    with pytest.raises(ValueError, match="observed"), observed, mixing(model, [torch.ones(2)] * 2):
        pass


def test_cli_duo_trains_on_text_and_writes_a_plan_that_reads(tmp_path, capsys):
    """An imported model with a tokenizer: the gates train on passkeys in the shipped text, and
    the manifest says so (the prompts, the steps run, the undecided gates)."""
    pytest.importorskip("transformers")
    from test_cli_imported import hf_dir

    ckpt = tmp_path / "llama-ckpt"
    assert exit_code(["import", str(hf_dir("llama", tmp_path)), "--out", str(ckpt)]) == 0
    out = tmp_path / "plan"
    args = ["kv-plan", str(ckpt), "--method", "duo", "--full-heads", "0.25", "--sink", "2",
            "--window", "8", "--steps", "3", "--set", "prompt_tokens=256", "--set", "passkeys=1",
            "--out", str(out)]  # fmt: skip
    assert exit_code(args) == 0
    plan = KVPlan.read(out)
    assert (plan.method, plan.sink, plan.window) == ("duo", SINK, WINDOW)
    assert sum(map(len, plan.full)) == 1  # a quarter of 2 layers x 2 key/value heads
    scores = pd.read_csv(out / "scores.csv")
    assert len(scores) == 4 and set(scores.method) == {"duo"}
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["duo_prompts"] == "passkeys in text" and settings["duo_prompt_tokens"] == 256
    assert settings["duo_steps_run"] == 3 and settings["prompt_tokens"] == 256
    gates = scores["value"].tolist()
    assert settings["duo_undecided"] == sum(1 for v in gates if 0.05 < v < 0.95)
    capsys.readouterr()
    for extra in (["--steps", "0"], ["--lr", "0"], ["--l1", "-1"], ["--set", "warmup=0.9"],
                  ["--set", "passkeys=0"], ["--set", "prompt_tokens=96"]):  # fmt: skip
        bad = [*args[:-1], str(tmp_path / "bad"), *extra]
        assert exit_code(bad) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "Traceback" not in err and "\n" not in err
