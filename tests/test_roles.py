"""Head roles on heads built to have them: the score of the built role is ~1 and the others are
what a hand count over the pattern gives."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from probe.analysis.roles import (
    ROLE_COLUMNS,
    InductionProbe,
    OffsetProfile,
    head_roles,
    repeated_tokens,
)
from probe.config import ModelConfig
from probe.data.tasks import BOS, N_SPECIAL, TaskConfig
from probe.measure.evaluate import eval_batches, form_for
from probe.model import AttentionCall, Transformer
from probe.site import Site


def pattern_call(probs: torch.Tensor, causal: bool = True, site: str = "blocks.0.attn"):
    """An attention call whose weights are `probs` [batch, head, n, n]."""
    b, h, n, _ = probs.shape
    z = torch.zeros(b, h, n, 4)
    visible = torch.ones(n, n, dtype=torch.bool).tril().view(1, 1, n, n) if causal else None
    where = Site(site, 0, site.endswith(".cross"), causal, h, h, tuple(range(h)))
    call = AttentionCall(where, z, z, z, torch.ones(h), None, None, visible)
    call.probs = probs
    return call


def roles_of(observer) -> pd.DataFrame:
    return observer.table().set_index(["head", "statistic"])


def test_previous_token_positional_and_sink_from_patterns():
    n = 10
    prev = torch.zeros(n, n)
    prev[0, 0] = 1.0
    prev[torch.arange(1, n), torch.arange(0, n - 1)] = 1.0  # i -> i - 1
    sink = torch.zeros(n, n)
    sink[:, 0] = 1.0  # everything on key 0
    back2 = torch.zeros(n, n)
    back2[torch.arange(n), (torch.arange(n) - 2).clamp_min(0)] = 1.0  # i -> i - 2
    probs = torch.stack([prev, sink, back2]).unsqueeze(0)  # [1, 3, n, n]
    profile = OffsetProfile()
    profile.record(pattern_call(probs))
    t = roles_of(profile)
    assert t.loc[(0, "previous_token"), "value"] == pytest.approx(1.0)
    assert t.loc[(0, "positional"), ["value", "offset"]].tolist() == pytest.approx([1.0, -1])
    assert t.loc[(1, "sink"), "value"] == pytest.approx(1.0)
    # the sink head looks at offset -i: only offset -1 at row 1 and 0 at row 0 (excluded)
    assert t.loc[(1, "previous_token"), "value"] == pytest.approx(1 / (n - 1))
    assert t.loc[(2, "positional"), ["value", "offset"]].tolist() == pytest.approx([1.0, -2])
    # rows 1 and 2 of the offset -2 head look at key 0 (clamped): sink = 2 / (n - 1)
    assert t.loc[(2, "sink"), "value"] == pytest.approx(2 / (n - 1))


def test_induction_on_a_built_pattern():
    period = 6
    n = 2 * period + 1
    induct = torch.full((n, n), 0.0)
    for i in range(n):
        target = i - period + 1 if i >= period + 1 else 0
        induct[i, target] = 1.0
    uniform = torch.tril(torch.ones(n, n))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    probe = InductionProbe(period)
    probe.record(pattern_call(torch.stack([induct, uniform]).unsqueeze(0)))
    t = roles_of(probe)
    assert t.loc[(0, "induction"), "value"] == pytest.approx(1.0)
    rows = torch.arange(period + 1, n).double()
    assert t.loc[(1, "induction"), "value"] == pytest.approx(float((1 / (rows + 1)).mean()))
    cross = InductionProbe(period)
    cross.record(pattern_call(torch.stack([induct]).unsqueeze(0), site="decoder.0.cross"))
    assert cross.table().value.isna().all()


def test_repeated_tokens_layout():
    tokens = repeated_tokens(vocab_size=21, period=5, batch_size=3, seed=0)
    assert tokens.shape == (3, 11)
    assert (tokens[:, 0] == BOS).all()
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:])
    assert tokens[:, 1:].min() >= N_SPECIAL and tokens.max() < 21


def built_model(arch: str, pe: str) -> Transformer:
    """Head 0 of every self-attention: previous token (T5) or itself (ALiBi); q zeroed so the
    positional bias alone decides."""
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(arch=arch, pe=pe, n_layer=2, n_head=4, d_model=32, vocab_size=21)
    ).eval()
    with torch.no_grad():
        for attn in model.attention_modules():
            attn.q.weight.zero_()
            attn.q.bias.zero_()
            if pe == "t5" and attn.score_bias is not None:
                attn.score_bias.table.weight.zero_()
                attn.score_bias.table.weight[1, 0] = 50.0  # bucket 1: the key one step back
            if pe == "alibi" and attn.score_bias is not None:
                attn.score_bias.slopes[0] = 50.0
    return model


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_head_roles_on_built_models(arch):
    model = built_model(arch, "t5")
    batches = eval_batches(TaskConfig(), form_for(arch), [6, 9], 8, 1, seed=0)
    table = head_roles(model, batches, period=7)
    assert list(table.columns) == ROLE_COLUMNS
    sites = [s.name for s in model.cfg.sites()]
    assert len(table) == len(sites) * 4 * 4
    self_sites = [i for i, s in enumerate(sites) if not s.endswith(".cross")]
    cross = [i for i, s in enumerate(sites) if s.endswith(".cross")]
    prev = table[(table.statistic == "previous_token") & (table["head"] == 0)].set_index("layer")
    assert (prev.loc[self_sites, "value"] > 0.99).all()
    assert prev.loc[cross, "value"].isna().all()
    others = table[(table.statistic == "previous_token") & (table["head"] != 0)]
    assert (others.value.dropna() < 0.5).all()
    induction = table[table.statistic == "induction"].set_index("layer")
    assert induction.loc[cross, "value"].isna().all()
    assert induction.loc[self_sites, "value"].notna().all()


def test_self_attending_head_is_positional_with_offset_zero():
    model = built_model("decoder", "alibi")
    batches = eval_batches(TaskConfig(), "decoder", [8], 8, 1, seed=1)
    table = head_roles(model, batches, period=5)
    pos = table[(table.statistic == "positional") & (table["head"] == 0)]
    assert (pos.value > 0.99).all() and (pos.offset == 0).all()
