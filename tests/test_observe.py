"""AttentionStats on real models: every (layer, head) reported, nothing left attached, the model's
output untouched, and the numbers equal to a direct computation from the attention weights."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches, form_for
from probe.measure.observe import AttentionStats, Fanout, _SiteTotals, attention_stats
from probe.measure.streaming import STATISTICS
from probe.model import Transformer


def tiny(arch="decoder", pe="learned", **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, pe=pe, n_layer=2, n_head=4, d_model=32, vocab_size=21, **kw)
    return Transformer(cfg).eval()


def run(model, tokens, observer):
    source = tokens if model.encoder is not None else None
    with torch.no_grad(), model.observe(observer):
        return model(tokens, source=source)


class Weights:
    """Keeps every attention matrix (the test's own independent record)."""

    needs_weights = True

    def __init__(self):
        self.calls = []

    def record(self, call):
        self.calls.append((call.layer, call.probs.double().clone(), call.visible))


def test_two_layer_model_reports_every_layer_and_head():
    model = tiny()
    stats = AttentionStats()
    run(model, torch.randint(5, 21, (3, 12)), stats)
    table = stats.table()
    assert list(table.columns) == ["layer", "site", "head", "statistic", "value", "min", "max", "n"]
    pairs = set(zip(table.layer, table["head"], strict=True))
    assert pairs == {(layer, head) for layer in range(2) for head in range(4)}
    assert set(table.statistic) == set(STATISTICS)
    assert len(table) == 2 * 4 * len(STATISTICS)
    assert table.value.notna().all()
    assert (table["min"] <= table.value + 1e-9).all() and (table.value <= table["max"] + 1e-9).all()


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_sites_and_original_head_ids(arch):
    """Pruned models keep original head ids; every site of every architecture appears."""
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, d_model=32, vocab_size=21)
    heads = [(0, 2, 3), (1,)] + [(0, 1, 2, 3)] * (cfg.n_sites - 2)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**cfg.to_dict(), "kept_heads": heads})).eval()
    stats = AttentionStats(["entropy"])
    run(model, torch.randint(5, 21, (2, 9)), stats)
    table = stats.table()
    assert list(dict.fromkeys(table.site)) == [s.name for s in cfg.sites()]
    assert table[table.layer == 0]["head"].tolist() == [0, 2, 3]
    assert table[table.layer == 1]["head"].tolist() == [1]


def test_no_hooks_remain_and_output_unchanged():
    model = tiny(pe="alibi")
    tokens = torch.randint(5, 21, (2, 10))
    with torch.no_grad():
        before = model(tokens)
    stats = AttentionStats()
    observed = run(model, tokens, stats)
    # the statistics hand the model softmax(logits) @ v from the weights they computed: the
    # same numbers as the fused kernel up to float rounding
    torch.testing.assert_close(observed, before, atol=1e-6, rtol=1e-5)
    assert all(m.observer is None for m in model.attention_modules())
    with pytest.raises(RuntimeError), model.observe(AttentionStats()):
        raise RuntimeError("boom")
    assert all(m.observer is None for m in model.attention_modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("pe", ["learned", "alibi", "t5"])
@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_matches_direct_computation_from_weights(arch, pe):
    """Mean entropy, p_max, sink mass and the one-hot fraction per head, from the weights."""
    model = tiny(arch, pe)
    tokens = torch.randint(5, 21, (4, 11))
    weights, stats = Weights(), AttentionStats(streaming=False)
    run(model, tokens, Fanout(weights, stats))
    table = stats.table().set_index(["layer", "head", "statistic"])
    for layer, p, _ in weights.calls:
        several = (p > 0).sum(-1) > 1  # [batch, head, q]: rows seeing more than one key
        plogp = torch.where(p > 0, p * p.log(), torch.zeros_like(p))
        entropy = -plogp.sum(-1)
        n = (p > 0).sum(-1).double()
        for h in range(p.shape[1]):

            def value(stat, h=h, layer=layer):
                return table.loc[(layer, h, stat), "value"]

            assert value("entropy") == pytest.approx(float(entropy[:, h].mean()), abs=1e-5)
            assert value("p_max") == pytest.approx(float(p[:, h].amax(-1).mean()), abs=1e-5)
            assert value("sink_mass") == pytest.approx(float(p[:, h, :, 0].mean()), abs=1e-5)
            norm = (entropy / n.log())[:, h][several[:, h]]
            assert value("normalized_entropy") == pytest.approx(float(norm.mean()), abs=1e-5)
            hot = (p[:, h].amax(-1) > 0.9)[several[:, h]].double().mean()
            assert value("p_max_gt_0.9") == pytest.approx(float(hot), abs=1e-9)
            assert table.loc[(layer, h, "entropy"), "max"] == pytest.approx(
                float(entropy[:, h].max()), abs=1e-5
            )


def test_uniform_head_has_entropy_log_n_and_one_hot_head_zero():
    """Zero queries give uniform rows (H = log n); a huge ALiBi slope gives one-hot rows."""
    model = tiny("encoder", "alibi")
    n = 12
    attn = model.attention_modules()[0]
    with torch.no_grad():
        attn.q.weight.zero_()
        attn.q.bias.zero_()
        attn.score_bias.slopes.zero_()
        attn.score_bias.slopes[1] = 1e4  # head 1: only the query's own position survives
    stats = AttentionStats(["entropy", "normalized_entropy", "p_max", "effective_keys"])
    run(model, torch.randint(5, 21, (2, n)), stats)
    t = stats.table().set_index(["layer", "head", "statistic"]).value
    assert t[(0, 0, "entropy")] == pytest.approx(math.log(n), abs=1e-5)
    assert t[(0, 0, "normalized_entropy")] == pytest.approx(1.0, abs=1e-5)
    assert t[(0, 0, "effective_keys")] == pytest.approx(n, rel=1e-5)
    assert t[(0, 1, "entropy")] == pytest.approx(0.0, abs=1e-6)
    assert t[(0, 1, "p_max")] == pytest.approx(1.0, abs=1e-6)


def test_max_logit_is_the_maximum_and_streaming_agrees():
    model = tiny(pe="alibi")
    tokens = torch.randint(5, 21, (3, 40))
    plain, streamed = AttentionStats(streaming=False), AttentionStats(streaming=True, tile=7)
    weights = Weights()
    run(model, tokens, Fanout(plain, streamed, weights))
    a, b = plain.table(), streamed.table()
    assert (a.value - b.value).abs().max() < 1e-5
    top = a[(a.statistic == "max_logit")]
    assert (top.value == top["max"]).all()


def test_only_requested_statistics_and_clear_errors():
    model = tiny()
    stats = AttentionStats(["entropy", "p_max"])
    run(model, torch.randint(5, 21, (2, 8)), stats)
    assert set(stats.table().statistic) == {"entropy", "p_max"}
    with pytest.raises(ProbeError, match="Did you mean 'entropy'"):
        AttentionStats(["entropi"])
    with pytest.raises(ProbeError, match="streaming"):
        AttentionStats(streaming="sometimes")


def test_attention_stats_groups_by_length_and_restores_mode():
    model = tiny()
    model.train()
    batches = eval_batches(TaskConfig(), form_for("decoder"), [4, 8], 8, 2, seed=0)
    table = attention_stats(model, batches, ["entropy", "max_logit"])
    assert model.training
    assert list(table.columns)[:3] == ["length", "layer", "site"]
    assert sorted(table.length.unique()) == [4, 8]
    assert (table.n[table.length == 4] == 2 * 8 * (2 * 4 + 2)).all()  # rows = batches x seq
    assert isinstance(table, pd.DataFrame) and table.value.notna().all()
    with pytest.raises(ProbeError):
        attention_stats(model, [])


@pytest.mark.parametrize("pe", ["learned", "rope", "alibi", "t5"])
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_observed_model_gives_the_same_logits(pe, arch):
    """AttentionStats hands the model softmax(logits) @ v from the weights it materializes;
    the logits must equal those of the unobserved fused path."""
    torch.manual_seed(7)
    cfg = ModelConfig(arch=arch, pe=pe, n_head=4, d_model=32, log_scale_len=5)
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 32, (3, 9))
    source = torch.randint(0, 32, (3, 6)) if arch == "encoder-decoder" else None
    with torch.no_grad():
        plain = model(tokens, source)
        stats = AttentionStats(streaming=False)
        with model.observe(stats):
            observed = model(tokens, source)
    assert (plain - observed).abs().max() < 1e-5
    assert len(stats.table()) > 0


def test_site_totals_leave_out_nan_rows_only_where_there_are_some():
    """Per-(statistic, head) sum, count, min and max over rows, NaN rows left out, against a
    direct loop: statistics without NaN rows, with some, and one head with no row at all."""
    g = torch.Generator().manual_seed(0)
    passes = [torch.randn(5, 3, 4, 7, generator=g) for _ in range(2)]  # [stat, batch, head, q]
    passes[0][1, :, :, 0] = float("nan")  # statistic 1: the first query row never counts
    passes[1][3, 0, 2, 4] = float("nan")  # statistic 3: one row of head 2
    passes[0][4, :, 1], passes[1][4, :, 1] = float("nan"), float("nan")  # no row of head 1
    totals = _SiteTotals("blocks.0.attn", (0, 1, 2, 3))
    for values in passes:
        totals.add(values)
    rows = torch.cat([v.transpose(1, 2).reshape(5, 4, -1) for v in passes], -1).double()
    for s in range(5):
        for h in range(4):
            kept = rows[s, h][~rows[s, h].isnan()]
            assert int(totals.count[s, h]) == len(kept)
            if len(kept):
                assert float(totals.sum[s, h]) == pytest.approx(float(kept.sum()), abs=1e-5)
                assert float(totals.min[s, h]) == float(kept.min())
                assert float(totals.max[s, h]) == float(kept.max())
    assert int(totals.count[4, 1]) == 0 and int(totals.count[0, 0]) == 2 * 3 * 7
