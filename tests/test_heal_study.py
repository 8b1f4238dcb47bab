"""The healing study: the [heal] section of a head study file, run end to end on a tiny imported
Llama (its table, report and cache; each seed pruning on its own importance split and measuring
its own held-out text), the recovery summary against a hand computation, and bad [heal]
settings as one line."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from probe.errors import ProbeError
from probe.study.heads.heal_report import TARGET, recovery


def heal_study_text(source, methods='["fisher-uniform", "fisher+tune"]', extra="",
                    text_seeds=2) -> str:  # fmt: skip
    return f"""
[study]
name = "tiny-heal"
question = "Does distillation heal a tiny Llama?"

[model]
source = "{source}"

[text]
max_tokens = 16
batch_size = 2
batches = 1
seeds = {text_seeds}

[heal]
methods = {methods}
fraction = 0.34
tokens = 128
seq_len = 16
batch_tokens = 32
lr = 0.003
eval_tokens = 32
seeds = 2
speed_repeats = 0
{extra}
"""


def test_a_heal_study_runs_reports_and_resumes(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    from cli_run import exit_code
    from test_cli_imported import hf_dir

    import probe.heal.prune as prune
    from probe.data.text import text_splits

    real, pruned_on = prune.prune_for_healing, []

    def recording(model, batches, fraction, method, *args, **kwargs):
        pruned_on.append((method, [b.inputs.tolist() for b in batches]))
        return real(model, batches, fraction, method, *args, **kwargs)

    monkeypatch.setattr(prune, "prune_for_healing", recording)
    file = tmp_path / "heal.toml"
    source = hf_dir("llama", tmp_path)
    file.write_text(heal_study_text(source))
    out = tmp_path / "out"
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0, capsys.readouterr()
    heal = pd.read_csv(out / "tables" / "heal.csv")
    assert {"stage", "method", "tokens", "seed", "metric", "value"} <= set(heal.columns)
    assert set(heal.stage) == {"original", "pruned", "healed"}
    assert set(heal.method) == {"fisher-uniform", "fisher+tune"} and set(heal.seed) == {0, 1}
    assert sorted(set(heal[heal.stage == "healed"].tokens)) == [32, 64, 128]
    # seed s prunes on importance split s of the [text] rows (made here from the same text and
    # tokenizer): two calls per method, on different rows
    from tokenizers import Tokenizer

    from probe.data.text import read_documents

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    sets, _ = text_splits(read_documents(), tokenizer, "causal-lm", 16, 2, 1, n_importance=2)
    splits = [[b.inputs.tolist() for b in split] for split in sets]
    assert splits[0] != splits[1]
    for method in ("fisher-uniform", "fisher+tune"):
        assert sorted(rows for m, rows in pruned_on if m == method) == sorted(splits)
    # and measures its own held-out text: the unpruned model's perplexity differs by seed
    original = heal[(heal.stage == "original") & (heal.metric == "perplexity")]
    assert original.groupby("seed").value.first().nunique() == 2
    assert original.groupby("method").value.nunique().max() == 2
    text = pd.read_csv(out / "tables" / "heal-text.csv")
    assert set(text.seed) == {0, 1} and text.groupby("seed").tokens_used.sum().tolist() == [32] * 2
    # the uniform pruning keeps 2 of every 3 query heads of each group (6 heads, 2 groups)
    uniform = heal[(heal.method == "fisher-uniform") & (heal.stage == "healed")]
    assert set(uniform.heads) == {8} and set(uniform.kv_heads) == {4}
    report = (out / "report.md").read_text()
    assert "## Healing by distillation" in report and "winning back" in report
    assert "### Held-out text" in report and "13 consecutive words" in report
    assert "Muralidharan et al. 2024" in report
    assert (out / "heal.png").is_file() and (out / "heal_recovery.csv").is_file()
    capsys.readouterr()
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0
    assert "0 run" in capsys.readouterr().out.replace("steps run", "run")  # all reused


def test_recovery_by_hand():
    rows = []
    for seed, healed in enumerate((30.0, 34.0, 32.0)):
        rows += [
            {"method": "m", "seed": seed, "stage": "original", "tokens": 0, "value": 20.0},
            {"method": "m", "seed": seed, "stage": "pruned", "tokens": 0, "value": 40.0},
            {"method": "m", "seed": seed, "stage": "healed", "tokens": 8, "value": 50.0},
            {"method": "m", "seed": seed, "stage": "healed", "tokens": 16, "value": healed},
        ]
    table = pd.DataFrame(rows).assign(metric="perplexity", heads=6, kv_heads=2, parameters=9)
    r = recovery(table).iloc[0]
    shares = [(40 - h) / 20 for h in (30.0, 34.0, 32.0)]  # 0.5, 0.3, 0.4
    assert r.tokens == 16 and r.recovered == pytest.approx(0.4)
    half = stats.t.ppf(0.975, 2) * pd.Series(shares).std() / math.sqrt(3)
    assert (r.low, r.high) == pytest.approx((0.4 - half, 0.4 + half))
    assert r.target == ("missed" if 0.4 + half < TARGET else "undecided")
    assert r.high > TARGET and r.target == "undecided"


@pytest.mark.parametrize(
    "methods, extra, words",
    [
        ('["fisher"]', "", "unknown method 'fisher'"),
        ('["fisher-group"]', "warmup = 1.5", "warmup must be from 0 to 0.99"),
        ('["fisher-group"]', "eval_at = [99]", "evaluation steps must lie in 1..4"),
    ],
)
def test_bad_heal_settings_are_one_line(tmp_path, methods, extra, words):
    from probe.study.kinds import load_any

    file = tmp_path / "bad.toml"
    file.write_text(heal_study_text("bundled:smollm2", methods, extra))
    with pytest.raises(ProbeError, match=words):
        load_any(file)


def test_more_heal_seeds_than_importance_splits_is_one_line(tmp_path):
    """Seed s prunes on importance split s, so [text] seeds must hold one per [heal] seed."""
    from probe.study.kinds import load_any

    file = tmp_path / "bad.toml"
    file.write_text(heal_study_text("bundled:smollm2", text_seeds=1))
    words = r"seeds = 2: seed s prunes on importance split s, but \[text\] seeds = 1 makes 1"
    with pytest.raises(ProbeError, match=words):
        load_any(file)


def test_each_seed_is_measured_against_its_own_original_and_pruned_model():
    """Seeds prune their own models and measure their own text: (40 - 30) / (40 - 20) = 0.5 and
    (50 - 20) / (50 - 10) = 0.75, mean 0.625 (the means' share, (45 - 25) / (45 - 15), would
    be 0.667); healed / original - 1: 0.5 and 1.0."""
    rows = []
    for seed, (original, pruned, healed) in enumerate(((20.0, 40.0, 30.0), (10.0, 50.0, 20.0))):
        rows += [{"seed": seed, "stage": "original", "tokens": 0, "value": original},
                 {"seed": seed, "stage": "pruned", "tokens": 0, "value": pruned},
                 {"seed": seed, "stage": "healed", "tokens": 8, "value": healed}]  # fmt: skip
    table = pd.DataFrame(rows).assign(method="m", metric="perplexity", heads=6, kv_heads=2,
                                      parameters=9)  # fmt: skip
    table.loc[table.seed == 1, "kv_heads"] = 1
    r = recovery(table).iloc[0]
    assert r.recovered == pytest.approx(0.625) and r.per_seed == "0.500 0.750"
    assert r.above_original == pytest.approx(0.75)
    assert (r.original, r.pruned, r.healed) == pytest.approx((15.0, 45.0, 25.0))
    assert r.shapes == "6 / 2 or 6 / 1"


def test_llama_cpp_ratio_ranges_pair_each_repeat_with_the_original():
    from probe.study.heads.heal_report import ratio_ranges

    speed = pd.DataFrame([
        {"model": m, "repeat": r, "metric": "decode_tokens_per_s", "value": v}
        for m, values in (("original", (10.0, 20.0, 40.0)), ("p", (12.0, 22.0, 40.0)))
        for r, v in enumerate(values)
    ])  # fmt: skip
    low, high = ratio_ranges(speed, "decode_tokens_per_s")["p"]
    assert (low, high) == pytest.approx((1.0, 1.2))  # 1.2, 1.1 and 1.0 by repeat


@pytest.mark.parametrize("healed, words", [(25.0, "**consistent in direction** (more than half"),
                                           (20.0, "**agrees** (the healed perplexity at or"),
                                           (38.0, "**inconclusive**: this budget")])  # fmt: skip
def test_minitron_says_what_the_evidence_supports(healed, words):
    """More than half won back with the perplexity still above the unpruned model's is
    consistent in direction, not agreement; agreement needs the quality recovered."""
    from types import SimpleNamespace

    from probe.study.heads.heal_report import minitron

    rows = []
    for seed, value in enumerate((healed, healed - 0.5)):
        rows += [{"seed": seed, "stage": "original", "tokens": 0, "value": 20.0},
                 {"seed": seed, "stage": "pruned", "tokens": 0, "value": 40.0},
                 {"seed": seed, "stage": "healed", "tokens": 8, "value": value}]  # fmt: skip
    table = pd.DataFrame(rows).assign(method="m", metric="perplexity", heads=6, kv_heads=2,
                                      parameters=9)  # fmt: skip
    said = minitron(SimpleNamespace(tables={"heal": table}))
    assert words in said, said
    above = (healed - 0.25) / 20 - 1  # the mean of the seeds' healed / original - 1
    where = f"stays {above:.0%} above" if above > 0 else f"is {-above:.0%} below"
    assert f"its perplexity {where} the unpruned model's" in said
