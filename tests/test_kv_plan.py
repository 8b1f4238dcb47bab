"""Choosing key/value-cache plans: a planted echo head is found and its whole key/value group
keeps the full cache; scores are recomputed from the attention weights by hand; the budget is
round(share x total) over the model; plan.json round-trips; bad input is one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from cli_run import exit_code

from probe.analysis.roles import repeated_tokens
from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.kv.plan import KVPlan
from probe.kv.planning import full_count, kv_table, make_plan
from probe.kv.razor import razor_scores
from probe.model import Transformer
from probe.train_config import TrainConfig

TASK = TaskConfig(name="copy", n_symbols=200)
PLANT = (1, 3)  # layer 1, query head 3: reads key/value head 1 of 2


def planted(n_kv_head: int = 2, arch: str = "decoder") -> Transformer:
    """A tiny model (no positional encoding) whose query head 3 of layer 1 is an echo head: its
    query and key projections both pick the same 16 input features, scaled up, so a token
    attends to itself and to every earlier occurrence of itself (echo score about 1/2)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=4, n_kv_head=n_kv_head,
                      d_model=64, pe="none", max_len=128, arch=arch)  # fmt: skip
    model = Transformer(cfg).eval()
    layer, head = PLANT
    attn = model.blocks[layer].attn
    d = cfg.d_head
    group = head // (cfg.n_head // n_kv_head)
    pick = torch.zeros(d, cfg.d_model)
    pick[:, :d] = 4.0 * torch.eye(d)
    with torch.no_grad():
        attn.q.weight[head * d : (head + 1) * d] = pick
        attn.k.weight[group * d : (group + 1) * d] = pick
        for block in model.blocks:  # the residual stream stays close to the embedding
            block.attn.o.weight.mul_(0.01)
            if hasattr(block, "mlp"):
                for p in block.mlp.parameters():
                    p.mul_(0.01)
    return model


class Weights:
    needs_weights = True

    def __init__(self):
        self.probs = {}

    def record(self, call):
        self.probs[call.layer] = call.probs.float().clone()  # [batch, head, q, k]


def test_echo_score_recomputed_by_hand_and_the_planted_head_wins():
    model = planted()
    period, rows = 16, 4
    table = razor_scores(model, period, rows, seed=3)
    tokens = repeated_tokens(model.cfg.vocab_size, period, rows, 3)
    w = Weights()
    with torch.no_grad(), model.observe(w):
        model.features(tokens)
    for r in table.itertuples():
        p = w.probs[r.layer][:, r.head]  # [batch, q, k]
        qs = range(period + 1, 2 * period + 1)  # the second copy
        back = period if r.statistic == "echo" else period - 1
        expected = sum(float(p[:, i, i - back].sum()) for i in qs) / (rows * period)
        assert r.value == pytest.approx(expected, abs=1e-5)
    echo = table[table.statistic == "echo"].set_index(["layer", "head"])["value"]
    assert echo.idxmax() == PLANT and echo.max() > 0.3  # the plant is not vacuous
    razor = {"period": period, "rows": rows}
    # the larger of the two scores (razor-max): the echo plant wins 1 of 4 kv heads
    result = make_plan(model, "razor-max", 0.25, 4, 8, options=razor)
    assert result.plan.full == ((), (1,))


def test_gqa_groups_move_together_and_the_score_is_the_group_max():
    model = planted(n_kv_head=2)
    result = make_plan(model, "razor-max", 0.5, 4, 8, options={"period": 16, "rows": 4})  # 2 of 4
    heads = result.heads
    by_hand = {}
    for r in heads.itertuples():
        key = (r.layer, r.head // 2)
        by_hand[key] = max(by_hand.get(key, -1.0), r.value)
    scores = result.scores.set_index(["layer", "kv_head"])["value"]
    assert scores.to_dict() == pytest.approx(by_hand)
    best = sorted(by_hand, key=lambda k: -by_hand[k])[:2]
    chosen = {(layer, g) for layer, gs in enumerate(result.plan.full) for g in gs}
    assert chosen == set(best) and (1, 1) in chosen
    for gs in result.plan.full:  # the plan lists key/value heads only
        assert set(gs) <= {0, 1}
    assert list(result.scores.columns) == ["layer", "site", "kv_head", "method", "statistic",
                                           "value"]  # fmt: skip
    # razor scores each statistic apart, each a group max
    razor = make_plan(model, "razor", 0.5, 4, 8, options={"period": 16, "rows": 4}).scores
    for stat in ("echo", "induction"):
        part = heads[heads.statistic == stat].groupby(["layer", "kv_head"])["value"].max()
        got = razor[razor.statistic == stat].set_index(["layer", "kv_head"])["value"]
        assert got.to_dict() == pytest.approx(part.to_dict())


def test_share_rounding_zero_and_one():
    assert [full_count(s, 4) for s in (0.0, 0.01, 0.3, 0.375, 0.5, 1.0)] == [0, 1, 1, 2, 2, 4]
    assert full_count(0.25, 60) == 15 and full_count(1 / 120, 60) == 1  # 0.5 rounds up
    model = planted()
    none = make_plan(model, "razor", 0.0, 4, 8, options={"period": 8, "rows": 2}).plan
    every = make_plan(model, "razor", 1.0, 4, 8, options={"period": 8, "rows": 2}).plan
    assert none.full == ((), ()) and every.full == ((0, 1), (0, 1))


def test_baselines_and_random_by_seed():
    model = planted(n_kv_head=4)  # 8 key/value heads
    assert make_plan(model, "streaming", 0.5, 4, 8).plan.full == ((), ())
    assert make_plan(model, "full", 0.5, 4, 8).plan.full == ((0, 1, 2, 3),) * 2
    plans = {s: make_plan(model, "random", 0.5, 4, 8, seed=s) for s in range(4)}
    assert make_plan(model, "random", 0.5, 4, 8, seed=1).plan == plans[1].plan
    assert len({p.plan.full for p in plans.values()}) > 1  # seeds differ
    for p in plans.values():
        assert sum(len(f) for f in p.plan.full) == 4
        top = p.scores.sort_values("value", ascending=False).head(4)
        assert {(r.layer, r.kv_head) for r in top.itertuples()} == {
            (layer, g) for layer, gs in enumerate(p.plan.full) for g in gs
        }


def test_nan_scores_rank_last():
    cfg = planted().cfg
    heads = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 2, 3], "statistic": ["echo"] * 3,
                          "value": [0.1, math.nan, 0.2]})  # fmt: skip
    table = kv_table(heads, cfg, ("echo",), "razor")
    assert table.value.isna().sum() == 2  # (0, 1) NaN, (1, 0) unscored


def test_bad_library_input():
    model = planted()
    for method, share, sink, window, what in [("razr", 0.5, 4, 8, "Unknown"),
                                              ("razor", 1.5, 4, 8, "[0, 1]"),
                                              ("razor", 0.5, -1, 8, "sink"),
                                              ("razor", 0.5, 4, 0, "window")]:  # fmt: skip
        with pytest.raises(ProbeError, match=None) as info:
            make_plan(model, method, share, sink, window)
        assert what in str(info.value)
    with pytest.raises(ProbeError, match="decoder"):
        make_plan(planted(arch="encoder"), "random", 0.5, 4, 8)


def save(path: Path, model: Transformer) -> Path:
    return save_checkpoint(path, model, TASK, TrainConfig(train_len=(2, 4)), {})


def test_cli_writes_a_plan_that_round_trips(tmp_path):
    model = planted()
    ckpt = save(tmp_path / "m", model)
    out = tmp_path / "plan"
    args = ["kv-plan", str(ckpt), "--method", "razor-max", "--full-heads", "0.25", "--sink", "2",
            "--window", "16", "--period", "16", "--rows", "4", "--out", str(out)]  # fmt: skip
    assert exit_code(args) == 0
    plan = KVPlan.read(out)
    assert plan == KVPlan("razor-max", 0.25, 2, 16, ((), (1,)))
    plan.check(model.cfg)
    scores = pd.read_csv(out / "scores.csv")
    assert len(scores) == 4 and set(scores.method) == {"razor-max"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == "kv-plan" and manifest["settings"]["seed"] == 0
    assert "versions" in json.dumps(manifest) or "torch" in json.dumps(manifest)
    assert exit_code(args) == 2  # no overwrite without the flag
    assert exit_code([*args, "--overwrite"]) == 0


@pytest.mark.parametrize(
    "extra",
    [["--full-heads", "1.5"], ["--full-heads", "-0.1"], ["--window", "0"], ["--sink", "-1"],
     ["--method", "nope"], ["--method", "retrieval"]],
)  # fmt: skip
def test_cli_bad_input_is_one_line(tmp_path, capsys, extra):
    ckpt = save(tmp_path / "m", planted())
    args = ["kv-plan", str(ckpt), "--method", "random", "--out", str(tmp_path / "o"), *extra]
    assert exit_code(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "Traceback" not in err
    assert not (tmp_path / "o" / "plan.json").exists()


def test_cli_refuses_an_encoder_and_an_unwritable_out(tmp_path, capsys):
    ckpt = save(tmp_path / "enc", planted(arch="encoder"))
    assert exit_code(["kv-plan", str(ckpt), "--method", "random", "--out",
                      str(tmp_path / "o")]) == 2  # fmt: skip
    assert "decoder" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ckpt = save(tmp_path / "m", planted())
    assert exit_code(["kv-plan", str(ckpt), "--method", "random", "--out",
                      str(blocker / "o")]) == 2  # fmt: skip


@pytest.mark.parametrize("bias", [0.3, -5.0])
def test_retrieval_plan_ranks_wu_scores_by_group(bias):
    """test_retrieval's model (a bias on the [UNK] id makes it copy the needle at 0.3; at -5 it
    copies none, and the plan is refused), with two key/value heads per layer: the plan keeps
    the key/value head whose best query head has the highest Wu et al. score, by a hand
    group-max of retrieval_scores."""
    pytest.importorskip("tokenizers")
    from test_retrieval import tokenizer

    from probe.analysis.retrieval import needle_prompts, retrieval_scores
    from probe.data.text import read_documents

    tok = tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), n_layer=2, n_head=4, n_kv_head=2,
                      d_model=32, pe="rope", max_len=256, head_bias=True)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q.weight.mul_(8.0)
        model.head.bias[0] = bias
    prompts = needle_prompts(read_documents(None), tok, 4, 60, seed=2)
    if bias < 0:  # it never emits the needle
        with pytest.raises(ProbeError, match="copied none"):
            make_plan(model, "retrieval", 0.25, 4, 8, prompts=prompts)
        return
    table = retrieval_scores(model, prompts)
    group_max = table.assign(g=table["head"] // 2).groupby(["layer", "g"])["value"].max()
    assert (group_max > 0).any()
    result = make_plan(model, "retrieval", 0.25, 4, 8, prompts=prompts)  # 1 of 4
    top = group_max.sort_values(ascending=False, kind="stable").index[0]
    assert result.plan.full[top[0]] == (top[1],)
    assert sum(len(f) for f in result.plan.full) == 1
    assert result.notes["prompts_retrieved"] == int(table["prompts"].iloc[0]) == 4
