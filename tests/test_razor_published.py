"""RazorAttention's head selection as published (Tang et al. 2024; Huawei's msmodelslim): the top
induction heads and the top echo heads, ranked separately over the whole model, keep the full
cache. Checked against hand-written answers and an independent selection; `razor-max` keeps
probe's earlier rule (the larger of the two scores), recomputed here from the per-head scores."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest
from test_kv_plan import planted

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.kv.methods import METHODS
from probe.kv.methods.razor import RazorOptions, choose
from probe.kv.planning import SCORE_COLUMNS, make_plan, scored_plan


def config(n_layer: int, n_kv_head: int = 2) -> ModelConfig:
    return ModelConfig(vocab_size=50, n_layer=n_layer, n_head=4, n_kv_head=n_kv_head, d_model=16,
                       pe="none", max_len=64)  # fmt: skip


def table(induction: dict, echo: dict) -> pd.DataFrame:
    """SCORE_COLUMNS from {(layer, kv head): value} per statistic."""
    rows = [{"layer": layer, "site": f"blocks.{layer}.attn", "kv_head": g, "method": "razor",
             "statistic": stat, "value": v}
            for stat, values in (("induction", induction), ("echo", echo))
            for (layer, g), v in values.items()]  # fmt: skip
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def options(induction: float, echo: float) -> RazorOptions:
    return RazorOptions(induction_ratio=induction, echo_ratio=echo)


# 3 layers x 2 key/value heads, no ties
INDUCTION = {(0, 0): 0.1, (0, 1): 0.9, (1, 0): 0.8, (1, 1): 0.2, (2, 0): 0.3, (2, 1): 0.7}
ECHO = {(0, 0): 0.95, (0, 1): 0.5, (1, 0): 0.1, (1, 1): 0.2, (2, 0): 0.6, (2, 1): 0.05}


def test_the_published_rule_by_hand():
    cfg = config(3)
    # round(6 x 0.34) = 2 by induction: (0, 1), (1, 0); round(6 x 0.17) = 1 by echo: (0, 0)
    assert choose(table(INDUCTION, ECHO), cfg, None, options(0.34, 0.17)) == ((0, 1), (0,), ())
    # the top echo head is an induction head too: the union is 2 heads, not topped up
    overlap = {**ECHO, (0, 1): 0.99}
    assert choose(table(INDUCTION, overlap), cfg, None, options(0.34, 0.17)) == ((1,), (0,), ())
    # no echo head (round(6 x 0.01) = 0), round(6 x 0.14) = 1 induction head
    assert choose(table(INDUCTION, ECHO), cfg, None, options(0.14, 0.01)) == ((1,), (), ())


def test_at_a_share_the_counts_split_by_the_ratios_and_an_overlap_is_topped_up():
    cfg = config(3)
    overlap = {**ECHO, (0, 1): 0.99}
    # share 0.5: 3 heads, 3 x 0.17 / 0.51 = 1 by echo, (0, 1); then induction's (0, 1) is
    # taken, so its next two: (1, 0) and (2, 1)
    assert choose(table(INDUCTION, overlap), cfg, 0.5, options(0.34, 0.17)) == ((1,), (0,), (1,))
    # no overlap: echo's (0, 0) and induction's (0, 1), (1, 0)
    assert choose(table(INDUCTION, ECHO), cfg, 0.5, options(0.34, 0.17)) == ((0, 1), (0,), ())
    # echo only: the top 3 echo heads
    assert choose(table(INDUCTION, ECHO), cfg, 0.5, options(0.0, 1.0)) == ((0, 1), (), (0,))


def top(values: dict, k: int) -> list:
    """The k best heads, NaN last, ties to the earlier layer then head (written apart from
    probe.kv.planning.ranked)."""

    def key(h):
        v = values[h]
        return (math.inf if v != v else -v, h)

    return sorted(values, key=key)[:k]


def flat(full) -> set:
    return {(layer, g) for layer, gs in enumerate(full) for g in gs}


@pytest.mark.parametrize("seed", range(6))
def test_random_tables_against_an_independent_selection(seed):
    rng = random.Random(seed)
    cfg = config(10)  # 20 key/value heads
    heads = [(layer, g) for layer in range(10) for g in range(2)]
    induction = {h: rng.choice([rng.random(), rng.random(), math.nan, 0.5]) for h in heads}
    echo = {h: rng.choice([rng.random(), induction[h], 0.5]) for h in heads}  # ties, overlaps
    ratios = (rng.choice([0.0, 0.1, 0.14, 0.3]), rng.choice([0.01, 0.05, 0.2]))
    scores = table(induction, echo)
    # published: each ranking's round(ratio x 20) (half to even), the union
    n_i, n_e = round(20 * ratios[0]), round(20 * ratios[1])
    want = set(top(induction, n_i)) | set(top(echo, n_e))
    assert flat(choose(scores, cfg, None, options(*ratios))) == want
    for share in (0.05, 0.25, 0.6, 1.0):
        n = max(1, math.floor(20 * share + 0.5))
        by_echo = math.floor(n * ratios[1] / sum(ratios) + 0.5)
        want = set(top(echo, by_echo))
        for h in top(induction, 20):  # the next induction heads until the count is met
            if len(want) == n:
                break
            want.add(h)
        got = flat(choose(scores, cfg, share, options(*ratios)))
        assert got == want and len(got) == n  # the union is exactly the share's count


def test_the_defaults_on_90_heads_keep_13_by_induction_and_1_by_echo():
    cfg = config(45)  # 90 key/value heads, as SmolLM2-135M
    rng = random.Random(1)
    heads = [(layer, g) for layer in range(45) for g in range(2)]
    induction = {h: rng.random() for h in heads}
    echo = {h: rng.random() for h in heads}
    got = flat(choose(table(induction, echo), cfg, None, RazorOptions()))
    assert got == set(top(induction, 13)) | set(top(echo, 1))  # round(12.6), round(0.9)
    at_share = flat(choose(table(induction, echo), cfg, 0.15, RazorOptions()))
    assert len(at_share) == 14 and set(top(echo, 1)) <= at_share  # 13.5 rounds up to 14


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"induction_ratio": 1.5}, r"^induction_ratio must be from 0 to 1 .*got 1\.5\.$"),
        ({"echo_ratio": -0.01}, r"^echo_ratio must be from 0 to 1 .*got -0\.01\.$"),
        ({"buffer_ratio": -1.0}, r"^buffer_ratio must be at least 0 .*got -1\.0\.$"),
        ({"echo_ratio": math.inf}, r"field 'echo_ratio' must be a finite number"),
        ({"compensate": 1}, r"field 'compensate' must be"),
    ],
)
def test_option_bounds_are_one_line(given, said):
    with pytest.raises(ProbeError, match=said) as info:
        METHODS.get("razor").read(given)
    assert "\n" not in str(info.value)


def test_both_ratios_0_and_a_share_less_method_are_refused():
    model = planted()
    with pytest.raises(ProbeError, match=r"^induction_ratio and echo_ratio are both 0"):
        zero = {"induction_ratio": 0, "echo_ratio": 0, "period": 8, "rows": 2}
        make_plan(model, "razor", 0.5, 4, 8, options=zero)
    with pytest.raises(ProbeError, match=r"^the random method needs a full-head share"):
        make_plan(model, "random", None, 4, 8)


def test_razor_max_is_the_earlier_rule():
    model = planted(n_kv_head=2)
    result = make_plan(model, "razor-max", 0.5, 4, 8, options={"period": 16, "rows": 4})
    best: dict = {}
    for r in result.heads.itertuples():  # max over both statistics and the group's query heads
        key = (r.layer, r.head // 2)
        best[key] = max(best.get(key, -1.0), r.value)
    assert flat(result.plan.full) == set(top(best, 2)) and (1, 1) in flat(result.plan.full)
    scores = result.scores.set_index(["layer", "kv_head"])
    assert scores["value"].to_dict() == pytest.approx(best)
    assert set(scores["statistic"]) == {"max(echo, induction)"}
    assert result.plan.method == "razor-max"


def test_study_keys_of_both_methods():
    from probe.study.heads.steps.kv import KVOptions  # builds: no key is taken twice

    razor, razor_max = METHODS.get("razor"), METHODS.get("razor-max")
    assert list(razor.study_keys().values()) == [
        "razor_period", "razor_rows", "razor_induction_ratio", "razor_echo_ratio",
        "razor_buffer_ratio", "razor_compensate"]  # fmt: skip
    assert list(razor_max.study_keys().values()) == ["razor_max_period", "razor_max_rows"]
    kv = KVOptions()
    assert (kv.razor_induction_ratio, kv.razor_echo_ratio) == (0.14, 0.01) and kv.razor_compensate


def test_a_razor_plan_carries_its_fields_and_its_own_share():
    model = planted(n_kv_head=2)  # 4 key/value heads; the plant is an echo head of (1, 1)
    given = {"period": 16, "rows": 4, "induction_ratio": 0.0, "echo_ratio": 0.25,
             "buffer_ratio": 5.0, "compensate": False}  # fmt: skip
    result = make_plan(model, "razor", None, 4, 8, options=given)
    assert result.plan.full == ((), (1,)) and result.plan.full_share == 0.25  # 1 of 4
    assert (result.plan.buffer_ratio, result.plan.compensate) == (5.0, False)
    scores = result.scores
    assert sorted(set(scores.statistic)) == ["echo", "induction"] and len(scores) == 8
    again = scored_plan("razor", scores, model.cfg, None, 4, 8, given)
    assert again == result.plan
    default = make_plan(model, "razor", 0.5, 4, 8, options={"period": 16, "rows": 4}).plan
    assert (default.buffer_ratio, default.compensate) == (0.0, True)
