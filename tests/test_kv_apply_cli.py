"""`probe eval CKPT --kv-plan DIR` on an imported GQA model: loss and needle rows with the plan
and the full cache, the bytes allocated as sink + window predict; bad plans are one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from cli_run import exit_code

from probe.kv.plan import KVPlan

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("kv")
    ckpt = root / "llama-ckpt"  # 2 layers, 6 query heads in 2 kv groups of 8 dims, float32
    assert exit_code(["import", str(hf_dir("llama", root)), "--out", str(ckpt)]) == 0
    bert = root / "bert-ckpt"
    assert exit_code(["import", str(hf_dir("bert-mlm", root)), "--out", str(bert)]) == 0
    return ckpt, bert


def plan_dir(path, full, sink=2, window=6):
    path.mkdir()
    KVPlan("streaming", 0.0, sink, window, full).write(path / "plan.json")
    return path


EVAL = ["--lengths", "16", "--batch-size", "2", "--batches", "1", "--needle-tokens", "64",
        "--needles", "2"]  # fmt: skip


def test_eval_with_a_plan_reports_loss_needles_and_bytes(llama, tmp_path):
    plan = plan_dir(tmp_path / "plan", ((), ()))
    out = tmp_path / "eval"
    assert exit_code(["eval", str(llama[0]), "--out", str(out), "--kv-plan", str(plan), *EVAL]) == 0
    table = pd.read_csv(out / "eval.csv")
    assert set(table.cache) == {"plan", "full"}
    metrics = {"loss", "needle_accuracy", "needle_exact", "kv_bytes", "kv_peak_bytes"}
    assert set(table.metric) == metrics
    got = table[table.metric == "kv_bytes"].set_index("cache").value
    # 2 sites x (k, v) x 2 kv heads x (sink 2 + window 6) x 8 dims x 4 bytes
    assert got["plan"] == 2 * 2 * 2 * (2 + 6) * 8 * 4
    assert got["full"] > 6 * got["plan"]  # ~64 tokens against 8
    peak = table[table.metric == "kv_peak_bytes"].set_index("cache").value
    # the papers' prefill: the whole prompt in every head, then the cut (the full cache's peak
    # also holds the decoded tokens)
    assert got["plan"] < peak["plan"] <= peak["full"] == got["full"]
    assert json.loads((out / "manifest.json").read_text())["settings"]["prefill"]["mode"] == "full"
    loss = table[table.metric == "loss"].set_index("cache").value
    assert loss["plan"] != loss["full"]  # 16-token rows: the window hides keys
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["kv_plan"]["window"] == 6


@pytest.mark.parametrize(
    "case, needle",
    [
        ("sites", "attention sites"),
        ("groups", "no key/value heads"),
        ("window", "window >= 1"),
        ("missing", "does not exist"),
        ("garbled", "not a readable plan.json"),
        ("encoder", "applies to decoders"),
    ],
)
def test_bad_plans_are_one_line(llama, tmp_path, capsys, case, needle):
    path = tmp_path / "plan"
    ckpt = llama[1] if case == "encoder" else llama[0]
    if case == "sites":
        plan_dir(path, ((),))
    elif case == "groups":
        plan_dir(path, ((), (7,)))
    elif case == "encoder":
        plan_dir(path, ((), ()))
    elif case in ("window", "garbled"):
        path.mkdir()
        data = {"format": 1, "method": "streaming", "full_share": 0.0, "sink": 4, "window": 0,
                "full": [[], []]}  # fmt: skip
        text = json.dumps(data) if case == "window" else '{"format": 1, "full": [[],'
        (path / "plan.json").write_text(text)
    code = exit_code(["eval", str(ckpt), "--out", str(tmp_path / "o"), "--kv-plan", str(path),
                      *EVAL])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert needle in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("option", [["--needles", "2"], ["--needle-tokens", "256"]])
def test_needle_options_without_a_plan_are_one_line(llama, tmp_path, capsys, option):
    out = tmp_path / "o"
    code = exit_code(["eval", str(llama[0]), "--out", str(out), *option])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--kv-plan" in err, err
    assert not out.exists()  # refused before anything was written
