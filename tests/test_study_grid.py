"""Grid expansion: the cross product, variants crossed with the free axes, stable cell keys."""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import pytest

from probe.errors import ProbeError
from probe.study.grid.cells import expand, factor_column
from probe.study.grid.spec import parse_study, smoke_version

STUDY = """
[study]
name = "g"
question = "q"
[base.model]
n_layer = 1
d_model = 16
n_head = 2
[base.train]
steps = 3
train_len = [2, 4]
[grid]
model.pe = ["learned", "rope", "alibi"]
task.name = ["copy", "reverse"]
train.seed = [0, 1]
[[variant]]
name = "rope+random"
model.pe = "rope"
train.random_positions = true
[[variant]]
name = "copy-only-nope"
model.pe = "none"
task.name = "copy"
"""


def study(text: str = STUDY):
    return parse_study(tomllib.loads(text), Path("g.toml"))


def test_grid_is_the_cross_product_then_variants_over_free_axes():
    cells = expand(study())
    grid = [c for c in cells if not c.variant]
    expected = list(itertools.product(["learned", "rope", "alibi"], ["copy", "reverse"], [0, 1]))
    assert [(str(c.model.pe), str(c.task.name), c.seed) for c in grid] == expected
    rope = [c for c in cells if c.variant == "rope+random"]
    assert [(str(c.task.name), c.seed) for c in rope] == list(
        itertools.product(["copy", "reverse"], [0, 1])
    )
    assert all(c.train.random_positions and str(c.model.pe) == "rope" for c in rope)
    nope = [c for c in cells if c.variant == "copy-only-nope"]
    assert [(str(c.task.name), c.seed) for c in nope] == [("copy", 0), ("copy", 1)]
    assert len(cells) == 12 + 4 + 2
    assert [c.index for c in cells] == list(range(len(cells)))


def test_arms_and_identity_columns():
    cells = expand(study())
    assert {c.arm for c in cells} == {"learned", "rope", "alibi", "rope+random", "copy-only-nope"}
    ids = cells[0].identity()
    assert ids == {"cell": cells[0].key, "arm": "learned", "variant": "", "pe": "learned",
                   "task": "copy", "seed": 0, "L_min": 2, "L": 4}  # fmt: skip
    assert factor_column("model.n_head") == "n_head"
    assert factor_column("train.steps") == "steps"
    assert factor_column("model.layer") == "model_layer"


def test_vocabulary_follows_the_task():
    cells = expand(study(STUDY.replace('["copy", "reverse"]', '["copy", "addition"]')))
    for cell in cells:
        assert cell.model.vocab_size == cell.task.vocab_size


def test_keys_are_stable_distinct_and_ignore_the_device():
    a, b = expand(study()), expand(study())
    assert [c.key for c in a] == [c.key for c in b]
    assert len({c.key for c in a}) == len(a)
    on_gpu = expand(study(STUDY.replace("steps = 3", 'steps = 3\ndevice = "cuda"')))
    assert [c.key for c in on_gpu] == [c.key for c in a]
    longer = expand(study(STUDY.replace("steps = 3", "steps = 4")))
    assert not {c.key for c in longer} & {c.key for c in a}


def test_analysis_changes_the_cell_key_but_not_the_training_key():
    plain = expand(study())
    more = expand(study(STUDY + '[analysis.eval_lengths]\nlengths = "1:8"\n'))
    assert [c.train_key for c in plain] == [c.train_key for c in more]
    assert not {c.key for c in plain} & {c.key for c in more}


def test_overrides_apply_to_matching_cells_only():
    text = (
        STUDY + '[[override]]\nwhere = { "task.name" = "reverse", model.pe = ["rope", "alibi"] }\n'
    )
    text += "train.train_len = [2, 3]\ntrain.steps = 5\n"
    for cell in expand(study(text)):
        hit = str(cell.task.name) == "reverse" and str(cell.model.pe) in ("rope", "alibi")
        assert cell.train.train_len == ((2, 3) if hit else (2, 4))
        assert cell.train.steps == (5 if hit else 3)
        assert cell.identity()["L"] == (3 if hit else 4)
    with pytest.raises(ProbeError, match="needs where"):
        study(STUDY + "[[override]]\ntrain.steps = 5\n")
    with pytest.raises(ProbeError, match="'stepz'"):
        study(STUDY + '[[override]]\nwhere = { "task.name" = "copy" }\ntrain.stepz = 5\n')


def test_smoke_settings_win_over_overrides():
    text = STUDY + '[[override]]\nwhere = { "task.name" = "reverse" }\ntrain.steps = 500\n'
    text += "train.batch_size = 7\n[smoke]\ntrain.steps = 2\n"
    full = expand(study(text))
    smoke = expand(smoke_version(study(text)))
    assert {c.train.steps for c in full if str(c.task.name) == "reverse"} == {500}
    assert {c.train.steps for c in smoke} == {2}  # the smoke setting wins
    assert {c.train.batch_size for c in smoke if str(c.task.name) == "reverse"} == {7}


def test_a_variant_that_repeats_a_grid_cell_is_refused():
    text = STUDY + '[[variant]]\nname = "dup"\nmodel.pe = "alibi"\n'
    with pytest.raises(ProbeError, match="same configuration"):
        expand(study(text))
