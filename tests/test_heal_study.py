"""The healing study: the [heal] section of a head study file, run end to end on a tiny imported
Llama (its table, report and cache), the recovery summary against a hand computation, and bad
[heal] settings as one line."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from probe.errors import ProbeError
from probe.study.heads.heal_report import TARGET, recovery


def heal_study_text(source, methods='["fisher-uniform", "fisher+tune"]', extra="") -> str:
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
seeds = 1

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


def test_a_heal_study_runs_reports_and_resumes(tmp_path, capsys):
    pytest.importorskip("transformers")
    from cli_run import exit_code
    from test_cli_imported import hf_dir

    file = tmp_path / "heal.toml"
    file.write_text(heal_study_text(hf_dir("llama", tmp_path)))
    out = tmp_path / "out"
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0, capsys.readouterr()
    heal = pd.read_csv(out / "tables" / "heal.csv")
    assert {"stage", "method", "tokens", "seed", "metric", "value"} <= set(heal.columns)
    assert set(heal.stage) == {"original", "pruned", "healed"}
    assert set(heal.method) == {"fisher-uniform", "fisher+tune"} and set(heal.seed) == {0, 1}
    assert sorted(set(heal[heal.stage == "healed"].tokens)) == [32, 64, 128]
    # one pruned model per method, whatever the seed
    pruned = heal[(heal.stage == "pruned") & (heal.metric == "perplexity")]
    assert pruned.groupby("method").value.nunique().max() == 1
    # the uniform pruning keeps 2 of every 3 query heads of each group (6 heads, 2 groups)
    uniform = heal[(heal.method == "fisher-uniform") & (heal.stage == "healed")]
    assert set(uniform.heads) == {8} and set(uniform.kv_heads) == {4}
    report = (out / "report.md").read_text()
    assert "## Healing by distillation" in report and "winning back" in report
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
