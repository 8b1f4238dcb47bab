"""A head study (importance, curves by query head and by key/value group, tuned Fisher, layer
drop, roles, a knock-out, timing) of a tiny random model of every family added for issue 24,
through `probe study run`: each family's own tests walk the other commands."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from cli_run import exit_code
from family_models import FAMILIES, save_tiny

pytest.importorskip("transformers")

STUDY = """
[study]
name = "tiny-{kind}"
question = "Which heads of a tiny {kind} matter?"

[model]
source = "{source}"

[text]
max_tokens = 16
batch_size = 4
batches = 1
seeds = 1

[importance]
methods = ["gradient", "random"]

[curves]
methods = ["gradient", "fisher+tune", "attention-layer"]
group_methods = ["gradient"]
fractions = [0.0, 0.5]

[roles]
enabled = true
period = 4
needles = 2
context = 64

[knockout]
heads = [1]
draws = 1
prompts = 2

[timing]
fractions = [0.5]
batch_sizes = [1]
repeats = 1
"""


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_head_study_of_every_family(kind, tmp_path):
    source = save_tiny(kind, tmp_path)
    file = tmp_path / "study.toml"
    file.write_text(STUDY.format(kind=kind, source=source))
    out = tmp_path / "study"
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0
    assert "**Answer.**" in (out / "report.md").read_text()
    importance = pd.read_csv(out / "tables" / "importance.csv")
    assert set(zip(importance.layer, importance["head"], strict=True)) == {
        (layer, head) for layer in range(2) for head in range(4)
    }
    curves = pd.read_csv(out / "tables" / "curves.csv")
    assert set(curves.unit) == {"head", "group"}
    assert json.loads((out / "manifest.json").read_text())["steps"]
