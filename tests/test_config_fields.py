"""Config fields from JSON and TOML: any value is either accepted with the declared type or refused
by a ProbeError that names the field, never a raw exception from deep inside."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from enum import StrEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.config import PE, ModelConfig
from probe.data.tasks import TaskConfig, TaskName
from probe.errors import ProbeError
from probe.train_config import Schedule, TrainConfig

CONFIGS = (ModelConfig, TrainConfig, TaskConfig)
FIELDS = [(cls, f.name) for cls in CONFIGS for f in dataclasses.fields(cls)]

# anything json.loads can return (NaN and infinities included, as Python's json reads them)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
# values close to valid ones, so the accepting path is exercised as well
plausible = (
    st.integers(-2, 70)
    | st.floats(-0.5, 2.0)
    | st.sampled_from(["copy", "rope", "encoder", "post", "gelu", "paper", "auto", "cpu"])
    | st.lists(st.integers(-1, 5), max_size=3)
    | st.lists(st.lists(st.integers(-1, 4), max_size=4), min_size=2, max_size=2)
)
values = json_values | plausible


def names_field(message: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", message) is not None


def check_types(cfg) -> None:
    """Each field of an accepted config holds what its declaration promises, judged from the
    field's default (not from probe's own type check)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if f.name == "qkv_bias":
            assert value is None or type(value) is bool
        elif f.name == "kept_heads":
            assert value is None or all(
                isinstance(site, tuple) and all(type(h) is int for h in site) for site in value
            )
        elif default is None and f.type == "float | None":
            assert value is None or (type(value) in (int, float) and math.isfinite(value)), (
                f.name,
                value,
            )
        elif default is None:  # int | None
            assert value is None or type(value) is int, (f.name, value)
        elif isinstance(default, StrEnum):
            assert isinstance(value, type(default)), (f.name, value)
        elif type(default) is float:
            assert type(value) in (int, float) and math.isfinite(value), (f.name, value)
        elif type(default) is tuple:
            assert type(value) is tuple and all(type(x) is int for x in value), (f.name, value)
        else:
            assert type(value) is type(default), (f.name, value)


@pytest.mark.parametrize(("cls", "name"), FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
@settings(max_examples=50, deadline=None)
@given(value=values)
def test_any_value_of_one_field_is_accepted_or_named(cls, name, value):
    try:
        cfg = cls.from_dict({name: value})
    except ProbeError as exc:
        assert names_field(str(exc), name), str(exc)
        return
    check_types(cfg)
    again = cls.from_dict(json.loads(json.dumps(cfg.to_dict())))  # as a checkpoint stores it
    assert json.dumps(again.to_dict()) == json.dumps(cfg.to_dict())


@pytest.mark.parametrize(
    ("cls", "data", "fragments"),
    [
        (
            ModelConfig,
            {"n_head": "two"},
            ["model field 'n_head' must be an integer", "'two' (str)"],
        ),
        (ModelConfig, {"d_model": 32.5}, ["'d_model' must be an integer", "32.5 (float)"]),
        (ModelConfig, {"d_model": None}, ["'d_model' must be an integer, got null"]),
        (
            ModelConfig,
            {"kept_heads": 5},
            ["'kept_heads' must be a list of lists of integers or null"],
        ),
        (ModelConfig, {"kept_heads": [[0], ["a"]]}, ["'kept_heads'"]),
        (ModelConfig, {"qk_norm": 1}, ["'qk_norm' must be true or false", "1 (int)"]),
        (ModelConfig, {"n_layer": True}, ["'n_layer' must be an integer", "True (bool)"]),
        (ModelConfig, {"dropout": float("nan")}, ["'dropout' must be a finite number"]),
        (ModelConfig, {"rope_base": float("inf")}, ["'rope_base' must be a finite number"]),
        (ModelConfig, {"rope_base": 1}, ["rope_base must be greater than 1"]),
        (ModelConfig, {"ln_eps": 0}, ["ln_eps must be positive"]),
        (ModelConfig, {"pe": 5}, ["'pe' must be one of sinusoidal, learned"]),
        (ModelConfig, {"pe": "rotary"}, ["positional encoding 'rotary' (field 'pe')"]),
        (TrainConfig, {"steps": "50"}, ["train field 'steps' must be an integer", "'50' (str)"]),
        (TrainConfig, {"train_len": "2:5"}, ["'train_len' must be a list of 2 integers"]),
        (TrainConfig, {"train_len": [2, 3, 4]}, ["'train_len' must be a list of 2 integers"]),
        (TrainConfig, {"lr": "0.1"}, ["'lr' must be a finite number"]),
        (TrainConfig, {"weight_decay": -0.1}, ["weight_decay must not be negative"]),
        (TrainConfig, {"lr_min_ratio": 2}, ["lr_min_ratio must be in [0, 1]"]),
        (TrainConfig, {"seed": 2**64}, ["seed must be in [0, 2**63)"]),
        (TrainConfig, {"extra": [1]}, ["'extra' must be a table"]),
        (TaskConfig, {"n_symbols": 4.0}, ["task field 'n_symbols' must be an integer"]),
        (TaskConfig, {"lsb_first": "yes"}, ["'lsb_first' must be true or false"]),
        (TaskConfig, {"name": "cpoy"}, ["(field 'name')", "Did you mean 'copy'?"]),
    ],
)
def test_bad_values_name_field_type_and_value(cls, data, fragments):
    with pytest.raises(ProbeError) as info:
        cls.from_dict(data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_good_values_are_kept_as_written():
    train = TrainConfig.from_dict({"lr": 1, "schedule": "paper", "grad_clip": 0,
                                   "train_len": [2, 5], "extra": {"note": [1, None]}})  # fmt: skip
    assert type(train.lr) is int and train.lr == 1  # cells hash their values as written
    assert train.schedule == Schedule.PAPER and train.train_len == (2, 5)
    assert train.extra == {"note": [1, None]}
    model = ModelConfig.from_dict({"heads": [[0, 1], [3]], "d_head": 8, "n_dec_layer": None,
                                   "ffn_mult": 2, "pe": "rope"})  # fmt: skip
    assert model.kept_heads == ((0, 1), (3,)) and model.d_head == 8 and model.n_dec_layer is None
    assert model.pe == PE.ROPE and model.d_ff == 2 * model.d_model
    task = TaskConfig.from_dict({"name": "addition", "lsb_first": True})
    assert task.name == TaskName.ADDITION and task.lsb_first is True
