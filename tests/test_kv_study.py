"""The KV-cache study: passkey prompts, one plan measured (needle decoding, loss and bytes against
independent computations), the memory-matched streaming baseline, the summary's statistics and
the [kv] section of a head study file, run end to end on a tiny imported Llama."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from scipy import stats
from test_kv_apply import _greedy_by_full_forward, plan_of

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.kv.needles import INTRO, QUESTION, passkey_prompts
from probe.kv.summary import by_length, clopper_pearson, targets, with_saved
from probe.kv.sweep import COLUMNS, measure_plan
from probe.model import Transformer
from probe.study.heads.steps.kv import matched_window


class CharTokenizer:
    """One token per character (code point mod 128), no special tokens."""

    def encode(self, text: str, add_special_tokens: bool = False):
        return SimpleNamespace(ids=[ord(c) % 128 for c in text])


def tiny(pe: str = "rope") -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=128, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pe=pe,
                      max_len=512)  # fmt: skip
    return Transformer(cfg).eval()


def test_passkey_prompts_have_their_length_key_and_spread_depths():
    prompts = passkey_prompts(CharTokenizer(), 4, 400, seed=3)
    depths = []
    for p in prompts:
        assert len(p.tokens) == 400
        k = len(p.answer)
        assert p.tokens[-k:].tolist() == p.answer.tolist()  # the prompt ends with the key
        assert p.tokens[p.sources].tolist() == p.answer.tolist()  # and holds it in the needle
        assert p.answer_steps.tolist() == list(range(400 - k - 1, 399))
        text = "".join(chr(t) for t in p.tokens.tolist())
        key = "".join(chr(t) for t in p.answer.tolist()).strip()
        assert len(key) == 5 and key.isdigit()
        assert f"The pass key is {key}. Remember it. {key} is the pass key." in text
        needle = len(f" The pass key is {key}. Remember it. {key} is the pass key.")
        room = 400 - len(INTRO) - needle - len(QUESTION) - k
        depths.append((int(p.sources[0]) - len(INTRO) - len(" The pass key is")) / room)
    for i, depth in enumerate(depths):  # one prompt in each quarter of the haystack
        assert i / 4 <= depth < (i + 1) / 4
    other = passkey_prompts(CharTokenizer(), 4, 400, seed=4)
    assert [p.answer.tolist() for p in other] != [p.answer.tolist() for p in prompts]
    assert passkey_prompts(CharTokenizer(), 4, 400, seed=3)[0].tokens.equal(prompts[0].tokens)
    with pytest.raises(ProbeError, match="no room for a haystack"):
        passkey_prompts(CharTokenizer(), 1, 200)


def _text_rows(seeds: int, rows: int, width: int):
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(seeds):
        tokens = torch.randint(128, (rows, width + 1), generator=gen)
        scored = torch.ones(rows, width, dtype=torch.bool)
        batches.append(SimpleNamespace(inputs=tokens[:, :-1], targets=tokens[:, 1:],
                                       loss_mask=scored))  # fmt: skip
    return batches


def test_one_plan_is_measured_as_decoding_and_the_formula_say():
    model = tiny()
    plan = plan_of([(), (1,)], sink=2, window=16, method="razor")
    text = _text_rows(2, 2, 48)
    table = measure_plan(model, CharTokenizer(), "razor", 0.25, lambda s, n: plan, [300], 2, 2,
                         text)  # fmt: skip
    assert list(table.columns) == COLUMNS
    assert set(table.metric) == {"needle_accuracy", "needle_exact", "loss"}
    assert (table.full_heads == 1).all() and (table.full == "L1K1").all()
    d_head, bytes_per = 32 // 4, 4  # float32 keys and values
    for seed in (0, 1):
        prompts = passkey_prompts(CharTokenizer(), 2, 300, seed)
        hits, exact = [], []
        for p in prompts:  # greedy decoding by the masked full forward, recomputed every step
            generated = _greedy_by_full_forward(model, p, plan)
            right = [a == b for a, b in zip(generated, p.answer.tolist(), strict=True)]
            hits.append(sum(right) / len(right))
            exact.append(float(all(right)))
        row = table[(table.seed == seed) & (table.length == 300)].set_index("metric")
        assert row.loc["needle_accuracy", "value"] == pytest.approx(sum(hits) / 2)
        assert row.loc["needle_exact", "value"] == pytest.approx(sum(exact) / 2)
        # after the prompt and the key but its last token: the full head holds every token, the
        # three streaming ones sink + window
        held = 300 - 1
        expected = 2 * d_head * bytes_per * (held + 3 * (2 + 16))
        assert row.loc["needle_accuracy", "kv_bytes"] == expected
        # the loss: the plan's masked full forward, by cross-entropy written out
        batch = text[seed]
        with torch.no_grad():
            logits = model(batch.inputs, plan=plan)  # [rows, seq, vocab]
        logp = torch.log_softmax(logits.double(), -1)
        nll = -logp.gather(-1, batch.targets.unsqueeze(-1)).mean()
        loss = table[(table.seed == seed) & (table.metric == "loss")].iloc[0]
        assert loss.length == 48 and loss.n == 2 * 48
        assert loss.value == pytest.approx(float(nll), rel=1e-5)
        assert loss.kv_bytes == 2 * d_head * bytes_per * (48 + 3 * 18)


def test_streaming_at_a_share_holds_the_share_plans_memory():
    model = tiny()
    for full, share, length in (([(0,), ()], 0.25, 300), ([(0, 1), ()], 0.5, 200),
                                ([(0, 1), (1,)], 0.75, 64)):  # fmt: skip
        window = matched_window(share, length, 2, 16)
        held = []
        for plan in (plan_of(full, sink=2, window=16),
                     plan_of([(), ()], sink=2, window=window, method="streaming")):  # fmt: skip
            cache = model.new_cache(plan)
            with torch.no_grad():
                model(torch.zeros(1, length, dtype=torch.long), cache=cache)
            held.append(cache.nbytes)
        assert held[1] == pytest.approx(held[0], rel=0.02), (share, held)
    assert matched_window(0.0, 1000, 4, 64) == 64  # nothing to match: the plain window
    assert matched_window(1.0, 1000, 4, 64) == 996  # every token, less the sink


def _table(rows):
    return pd.DataFrame(rows, columns=COLUMNS)


def test_the_summary_by_hand():
    rows = []
    for seed in range(3):
        for length in (100, 200):
            full_bytes = 1000.0 * length
            for method, share, acc, exact, held in (
                ("full", 1.0, 1.0, 1.0, full_bytes),
                ("retrieval", 0.2, 1.0 if seed else 0.5, 1.0 if seed else 0.0, 0.3 * full_bytes),
                ("random", 0.2, 0.0, 0.0, 0.3 * full_bytes),
                ("streaming", 0.2, 0.5, 0.5, 0.3 * full_bytes),
            ):
                peak = full_bytes if method == "full" else 0.5 * full_bytes
                for metric, value in (("needle_accuracy", acc), ("needle_exact", exact)):
                    rows.append([method, share, length, seed, metric, value, held, peak, 2, 0,
                                 ""])  # fmt: skip
    kv = _table(rows)
    assert with_saved(kv).saved.round(6).isin([0.0, 0.7]).all()
    assert with_saved(kv).peak_saved.round(6).isin([0.0, 0.5]).all()
    table = by_length(kv)
    r = table[(table.method == "retrieval") & (table.length == 100)].iloc[0]
    assert r.needle_accuracy == pytest.approx(2.5 / 3)
    assert (r.accuracy_min, r.accuracy_max, r.exact, r.prompts) == (0.5, 1.0, 4, 6)
    ci = stats.binomtest(4, 6).proportion_ci(method="exact")
    assert (r.exact_low, r.exact_high) == pytest.approx((ci.low, ci.high))
    t = targets(table).set_index("method")
    assert t.loc["retrieval", "saved_min"] == pytest.approx(0.7)
    assert t.loc["retrieval", "peak_saved_min"] == pytest.approx(0.5)
    assert t.loc["retrieval", "kept_min"] == pytest.approx(2.5 / 3)
    assert not t.loc["retrieval", "meets"]  # 83% of the full cache's accuracy, not 95%
    p = stats.fisher_exact([[8, 4], [6, 6]], alternative="greater")[1]
    assert t.loc["retrieval", "p_vs_streaming"] == pytest.approx(p)
    assert t.loc["random", "p_vs_streaming"] == pytest.approx(1.0)


def test_clopper_pearson_edges():
    assert clopper_pearson(0, 5)[0] == 0.0 and clopper_pearson(5, 5)[1] == 1.0
    low, high = clopper_pearson(9, 9)
    assert low == pytest.approx(0.025 ** (1 / 9)) and high == 1.0
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


def kv_study_text(source, methods: str = '["razor", "duo", "random"]') -> str:
    return f"""
[study]
name = "tiny-kv"
question = "How much of a tiny Llama's cache can go?"

[model]
source = "{source}"

[text]
max_tokens = 16
batch_size = 2
batches = 1
seeds = 1

[kv]
methods = {methods}
full_shares = [0.5]
sink = 2
window = 8
lengths = [96]
needles = 1
seeds = 2
loss_tokens = 32
loss_rows = 1
score_needles = 1
score_context = 64
razor_period = 8
razor_rows = 2
duo_steps = 2

[[contrast]]
claim = "razor heads hold the passkey better than random heads"
table = "kv"
metric = "needle_accuracy"
where = {{ full_share = 0.5 }}
a = "razor"
b = "random"
"""


def test_a_kv_study_runs_reports_and_resumes(tmp_path, capsys):
    pytest.importorskip("transformers")
    from cli_run import exit_code
    from test_cli_imported import hf_dir

    source = hf_dir("llama", tmp_path)
    file = tmp_path / "kv.toml"
    file.write_text(kv_study_text(source))
    out = tmp_path / "out"
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0, capsys.readouterr()
    kv = pd.read_csv(out / "tables" / "kv.csv")
    assert list(kv.columns) == COLUMNS
    methods = {"full", "streaming", "window", "razor", "duo", "random"}
    assert set(kv.method) == methods
    assert set(kv.seed) == {0, 1} and set(kv.length) == {96, 32}
    # the random plan is drawn per seed; the scored ones are the same in both seeds
    for method in ("razor", "duo"):
        assert kv[kv.method == method].full.nunique() == 1
    assert (kv[kv.method == "full"].full == "all").all()
    report = (out / "report.md").read_text()
    assert "## What the key/value plans save" in report and "### The target" in report
    assert "razor heads hold the passkey better than random heads" in report
    assert (out / "kv_accuracy.png").is_file() and (out / "kv_targets.csv").is_file()
    capsys.readouterr()
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0
    assert "0 run" in capsys.readouterr().out.replace("steps run", "run")  # all reused


def test_retrieval_scores_that_cannot_be_computed_are_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    from cli_run import exit_code
    from test_cli_imported import hf_dir

    file = tmp_path / "kv.toml"
    file.write_text(kv_study_text(hf_dir("llama", tmp_path), '["retrieval"]').split("[[")[0])
    capsys.readouterr()
    assert exit_code(["study", "run", str(file), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[kv] retrieval" in err and "score_context" in err


def test_lengths_the_full_cache_fails_and_a_missing_full_cache():
    from probe.study.heads.kv_report import kv_answer

    rows = []
    for seed in range(2):
        for method, share, acc in (("full", 1.0, 0.0), ("razor", 0.2, 0.0)):
            held = 1000.0 if method == "full" else 300.0
            for metric in ("needle_accuracy", "needle_exact"):
                rows.append([method, share, 100, seed, metric, acc, held, 1000.0, 2, 0, ""])
    kv = _table(rows)
    t = targets(by_length(kv)).set_index("method")
    assert t.loc["razor", "kept_min"] == 1.0  # 0 of the full cache's 0: all of it kept
    study = {"kv": {"sink": 4, "window": 8}}

    def findings(table):  # what kv_answer reads of a Findings
        return SimpleNamespace(study=study, kv=(by_length(table), targets(by_length(table))))

    assert "razor plans meet the target" in kv_answer(findings(kv))
    no_full = kv[kv.method != "full"]
    assert targets(by_length(no_full)).empty
    assert "no full-cache rows" in kv_answer(findings(no_full))
