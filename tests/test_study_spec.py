"""Study files: validation errors name the file, the section and the field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from tiny_study import SMOKE, tiny_study

from probe.errors import ProbeError
from probe.study.spec import load_study, parse_study, smoke_version

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
