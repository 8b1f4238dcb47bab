"""Counts before nouns in library messages and report text take the noun's number
(`probe.words.counted`): "1 head", "1 cell", "1 seed", never "1 heads"."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.model import Transformer
from probe.pruning.heads import check_counts, check_heads
from probe.words import counted

ONE_PLURAL = re.compile(r"(?<![\d.,])1 (heads|seeds|cells|steps|layers|sites|attention sites|rows|"
                        r"tokens|draws|timings|expectations|parameters)\b")  # fmt: skip


def test_counted_groups_digits_unless_asked_not_to():
    assert counted(2000, "step") == "2,000 steps"
    assert counted(2000, "step", grouped=False) == "2000 steps"  # as committed reports print it
    assert counted(1, "step", grouped=False) == "1 step"


def test_pruning_messages_of_a_one_head_model():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=8, n_layer=1, n_head=1, d_model=8))
    with pytest.raises(ProbeError) as info:
        check_counts([[0]], 2)
    assert "Cannot prune 2 heads: the model has only 1 head in 1 attention site." in str(info.value)
    with pytest.raises(ProbeError) as info:
        check_counts([[0]], [1], min_heads_per_layer=1)
    assert "Layer 0 has 1 head: removing 1" in str(info.value)
    with pytest.raises(ProbeError) as info:
        check_heads(model, [(3, 0)])
    assert "the model has 1 attention site (" in str(info.value)
    with pytest.raises(ProbeError) as info:
        check_counts([[0], [0]], [1])
    assert "Per-layer counts for 1 site;" in str(info.value)


def test_a_one_cell_one_head_study_report_says_so(tmp_path):
    from tiny_study import tiny_study

    from probe.study.grid.report import write_report
    from probe.study.grid.spec import parse_study

    text = tiny_study(pes=("learned",)).replace("train.seed = [0, 1]", "train.seed = [0]")
    text = text.replace("n_head = 2", "n_head = 1").replace("steps = 4", "steps = 1")
    text += '\n[[expect]]\ntable = "eval"\nmetric = "exact_match"\nbound = ">= 0"\n'
    study = parse_study(tomllib.loads(text), Path("one.toml"))
    rows = pd.DataFrame([
        {"cell": "c", "arm": "learned", "variant": "", "task": "copy", "seed": 0, "L_min": 2,
         "L": 3, "length": n, "metric": m, "value": 1.0}
        for n in (1, 2, 3, 4) for m in ("exact_match", "token_accuracy")
    ])  # fmt: skip
    path, _ = write_report(tmp_path, study, {"eval": rows}, {"seeds": [0]})
    report = path.read_text()
    assert "- 1 cell (model), seeds 0;" in report
    assert "1 layer(s), 1 head, d_model 16" in report and "Training: 1 step, batch" in report
    assert "The expectation passes." in report
    assert not ONE_PLURAL.search(report), ONE_PLURAL.search(report)


def test_a_contrast_sentence_with_one_seed():
    from probe.study.verdicts.contrast import _verdict
    from probe.study.verdicts.contrast_text import sentence

    row = pd.Series({"claim": "c", "change": False, "metric": "m", "a": "x", "b": "y",
                     "mean_a": 1.0, "mean_b": 0.0, "n_a": 1, "n_b": 1, "expect": "higher",
                     "p_claim": 0.5, "verdict": "v"})  # fmt: skip
    assert "1 vs 1 seed, p = 0.5" in sentence(row, ())
    assert (
        _verdict("higher", 0.5, 0.5, 2, 1)
        == "not testable: 2 against 1 seed cannot reach p <= 0.05"
    )
