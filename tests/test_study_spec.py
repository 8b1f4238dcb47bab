"""Study files: validation errors name the file, the section and the field."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_study import SMOKE, tiny_study

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.study.grid.spec import load_study, parse_study, smoke_version
from probe.train_config import TrainConfig

TINY = tiny_study(seed_key='"train.seed"', extra=SMOKE)  # a quoted dotted key too


def parse(text: str, name: str = "x.toml"):
    return parse_study(tomllib.loads(text), Path(name))


def error(text: str) -> str:
    with pytest.raises(ProbeError) as info:
        parse(text)
    return str(info.value)


def test_tiny_study_parses_with_quoted_and_nested_dotted_keys():
    study = parse(TINY)
    assert study.name == "tiny"
    assert study.grid == {"model.pe": ("learned", "rope"), "train.seed": (0, 1)}
    assert study.base["train"]["train_len"] == [2, 3]
    assert list(study.analysis) == ["eval_lengths"]


def test_unknown_model_field_is_named_with_a_suggestion():
    message = error(TINY.replace("n_head = 2", "n_heads = 2"))
    assert "x.toml" in message and "[base.model]" in message
    assert "'n_heads'" in message and "Did you mean 'n_head'?" in message


def test_unknown_top_level_section_is_named():
    message = error(TINY + "\n[grdi]\nx = 1\n")
    assert "'grdi'" in message and "Did you mean 'grid'?" in message


def test_unknown_grid_setting_is_named():
    message = error(TINY.replace('model.pe = ["learned", "rope"]', 'model.pee = ["learned"]'))
    assert "[grid]" in message and "'pee'" in message and "Did you mean 'pe'?" in message


def test_bad_grid_value_is_caught_before_running():
    message = error(TINY.replace('model.pe = ["learned", "rope"]', 'model.pe = ["rotary"]'))
    assert "rotary" in message and "positional encoding" in message


def test_unknown_analysis_step_suggests_the_right_one():
    message = error(TINY.replace("[analysis.eval_lengths]", "[analysis.eval_length]"))
    assert "'eval_length'" in message and "Did you mean 'eval_lengths'?" in message


def test_unknown_analysis_option_is_named():
    message = error(TINY.replace("n_batches = 1", "batches = 1"))
    assert "analysis.eval_lengths" in message and "'batches'" in message


def test_learned_table_too_short_for_the_evaluation_lengths():
    message = error(TINY.replace('lengths = "1:2L"', 'lengths = "1:20"'))
    assert "max_len" in message and "42" in message  # [BOS] 20 symbols [SEP] 20 symbols


def test_question_is_required():
    message = error(TINY.replace('question = "Does the runner work?"', ""))
    assert "question" in message


def test_variant_needs_a_name_and_unique_names():
    assert "needs a name" in error(TINY + "\n[[variant]]\ntrain.random_positions = true\n")
    twice = TINY + '\n[[variant]]\nname = "a"\nmodel.pe = "none"\n' * 2
    assert "used twice" in error(twice)


def test_expectation_errors_name_the_field():
    base = TINY + '\n[[expect]]\ntable = "eval"\nmetric = "exact_match"\n'
    assert "bound" in error(base)
    assert "'>= 0.99'" in error(base + 'bound = "about 1"\n')
    assert "'boundd'" in error(base + 'boundd = ">= 1"\n')


def test_smoke_version_overrides_base_and_grid():
    smoke = smoke_version(parse(TINY))
    assert smoke.is_smoke
    assert smoke.base["train"]["steps"] == 2
    assert smoke.grid["train.seed"] == (0,)
    assert smoke.grid["model.pe"] == ("learned", "rope")


def test_smoke_may_not_set_a_grid_axis_directly():
    text = TINY.replace("train.steps = 2", 'train.steps = 2\nmodel.pe = "rope"')
    assert "grid axis" in error(text)


def test_invalid_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[study\n")
    with pytest.raises(ProbeError, match="not valid TOML"):
        load_study(bad)
    with pytest.raises(ProbeError, match="No study file"):
        load_study(tmp_path / "missing.toml")


# ------------------------------------------------------------------ field values in study files

SECTIONS = {"model": ModelConfig, "task": TaskConfig, "train": TrainConfig}
SETTINGS = [(s, f.name) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
plausible = st.integers(-2, 40) | st.floats(-0.5, 2.0) | st.sampled_from(["rope", "copy", "x"])


def small_study() -> dict:
    """One rope cell of the tiny study (rope: no max_len limit to run into), as a dict."""
    data = tomllib.loads(tiny_study(pes=("rope",)))
    data["grid"] = {"model.pe": ["rope"], "train.seed": [0]}
    return data


def placed(key: str, value, where: str) -> tuple[dict, str]:
    """The small study with setting `key` = `value` in its base, grid or a variant, and the text
    that names the cell the value lands in (left out before looking for the field's name)."""
    data = small_study()
    section, _, name = key.partition(".")
    grid = {k: v[0] for k, v in data["grid"].items()}
    if where == "base":
        data["base"][section][name] = value
        return data, f"cell {grid}"
    if where == "grid":
        data["grid"][key] = [value]
        return data, f"cell { ({**grid, key: value}) }"
    data["variant"] = [{"name": "v", section: {name: value}}]
    free = {k: v for k, v in grid.items() if k != key}
    return data, f"cell v{ ({**free, key: value}) }"


@pytest.mark.parametrize(("section", "name"), SETTINGS, ids=[f"{s}.{n}" for s, n in SETTINGS])
@settings(max_examples=50, deadline=None)
@given(value=json_values | plausible, where=st.sampled_from(["base", "grid", "variant"]))
def test_any_setting_value_is_accepted_or_named(section, name, value, where):
    data, cell = placed(f"{section}.{name}", value, where)
    try:
        parse_study(data, Path("x.toml"))
    except ProbeError as exc:
        message = str(exc).replace(cell, "")
        if where == "variant" and "have the same configuration" in message:
            return  # the variant repeats the grid's cell: a fault of the study, not of the value
        assert re.search(rf"\b{name}\b", message), message


@pytest.mark.parametrize(
    ("old", "new", "fragments"),
    [
        ("d_model = 16", 'd_model = "big"', ["[base.model]", "'d_model' must be an integer"]),
        ("train_len = [2, 3]", 'train_len = "2:5"', ["[base.train]", "'train_len' must be a list"]),
        ("steps = 4", 'steps = "50"', ["[base.train]", "'steps' must be an integer", "'50'"]),
        ('model.pe = ["learned", "rope"]', 'model.d_model = [16, "big"]',
         ["[grid]", "model field 'd_model' must be an integer", "'big'"]),
        ('model.pe = ["learned", "rope"]', "model.d_model = [16, 32.5]", ["[grid]", "32.5"]),
        ("train.steps = 2", 'train.steps = "2"', ["[smoke]", "train field 'steps'"]),
        ('lengths = "1:2L"', 'lengths = ["a"]', ["analysis.eval_lengths", "'lengths'"]),
        ('name = "tiny"', 'name = "/tmp/elsewhere"', ["plain folder name"]),
        ('name = "tiny"', 'name = "../tiny"', ["plain folder name"]),
        ('name = "tiny"', 'name = "a\\\\b"', ["plain folder name"]),
    ],
)  # fmt: skip
def test_bad_setting_values_name_section_and_field(old, new, fragments):
    assert old in TINY
    message = error(TINY.replace(old, new))
    for fragment in fragments:
        assert fragment in message


def test_bad_values_of_variants_and_overrides_name_the_field():
    variant = TINY + '\n[[variant]]\nname = "long"\ntrain.steps = "x"\n'
    assert "[[variant]] #1 (long): train field 'steps' must be an integer" in error(variant)
    override = TINY + '\n[[override]]\nwhere = { "task.name" = "copy" }\ntrain.steps = 2.5\n'
    assert "[[override]] #1: train field 'steps' must be an integer" in error(override)


def test_expectation_on_a_table_the_study_never_writes():
    text = TINY + '\n[[expect]]\ntable = "evl"\nmetric = "exact_match"\nbound = ">= 0.9"\n'
    message = error(text)
    assert "'evl'" in message and "Did you mean 'eval'?" in message and "train, eval" in message
    pruning = text.replace('"evl"', '"pruning"')  # a real step's table, but no [analysis.prune]
    assert "'pruning'" in error(pruning)
    assert parse(text.replace('"evl"', '"train"')).expectations[0].table == "train"


def test_binary_and_unreadable_study_files(tmp_path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(ProbeError, match="is not a text file") as info:
        load_study(binary)
    assert str(binary) in str(info.value)


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("[base.train]", TINY.replace("steps = 4\n", 'steps = 4\ndevice = "tpu"\n', 1)),
        ("cell {'train.device': 'tpu'",  # grid values are checked as the cells are built
         TINY.replace("[grid]\n", '[grid]\ntrain.device = ["cpu", "tpu"]\n', 1)),
        ("cell t{", TINY + '\n[[variant]]\nname = "t"\ntrain.device = "tpu"\n'),
        ("cell {",
         TINY + '\n[[override]]\nwhere = { "task.name" = "copy" }\ntrain.device = "tpu"\n'),
    ],
)  # fmt: skip
def test_unknown_device_is_refused_at_load(where, text):
    message = error(text)
    assert message.startswith("x.toml") and where in message, message
    assert "Unknown device 'tpu'; use auto, cpu, cuda or cuda:N." in message


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:3", "CUDA:0"])
def test_device_names_are_checked_as_names_not_hardware(name):
    """A study for a GPU validates on a machine without one (the device is asked at run time)."""
    text = TINY.replace("steps = 4\n", f'steps = 4\ndevice = "{name}"\n', 1)
    assert parse(text).base["train"]["device"] == name
