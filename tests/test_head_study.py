"""Head studies of imported models: the spec, the cached steps, the evidence and the report."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from cli_run import exit_code

from probe.errors import ProbeError
from probe.pruning.objectives import operating_points
from probe.study.heads import evidence as ev
from probe.study.heads.spec import parse_head_study

pytest.importorskip("transformers")


def study_text(source: Path, fractions: str = "[0.0, 0.25, 0.5]") -> str:
    return f"""
[study]
name = "tiny-heads"
question = "Which heads of a tiny Llama matter?"

[model]
source = "{source}"

[text]
max_tokens = 16
batch_size = 4
batches = 1
seeds = 2

[importance]
methods = ["gradient", "fisher", "random"]

[curves]
methods = ["gradient", "fisher", "fisher+tune", "attention-layer", "random"]
group_methods = ["gradient"]
fractions = {fractions}

[roles]
enabled = true
period = 4
needles = 2
context = 64

[knockout]
heads = [2]
draws = 3
prompts = 2

[timing]
fractions = [0.5]
batch_sizes = [1]
repeats = 1

[operating]
tolerance = 0.5

[smoke]
text = {{ seeds = 1 }}
"""


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from test_cli_imported import hf_dir

    return hf_dir("llama", tmp_path_factory.mktemp("hf"))


def test_a_head_study_runs_resumes_and_reports(llama_dir, tmp_path, capsys):
    file = tmp_path / "tiny.toml"
    file.write_text(study_text(llama_dir))
    out = tmp_path / "out"
    assert exit_code(["study", "validate", str(file)]) == 0
    junit = tmp_path / "junit.xml"
    assert exit_code(["study", "run", str(file), "--out", str(out), "--junit", str(junit)]) == 0
    assert 'tests="0"' in junit.read_text()  # a head study measures; it has no expectations
    first = capsys.readouterr().out
    assert "0 reused from the cache" in first
    report = (out / "report.md").read_text()
    assert "**Answer.**" in report and "## Against published work" in report
    for name in ("curves.csv", "operating_points.csv", "knockout.png", "roles.png", "speed.csv"):
        assert (out / name).is_file(), name
    curves = pd.read_csv(out / "tables" / "curves.csv")
    assert set(curves.unit) == {"head", "group"}
    assert set(curves.seed) == {0, 1}
    # the unpruned point of every curve is the model's own score on the scoring split
    facts = pd.read_csv(out / "tables" / "model.csv").iloc[0]
    zero = curves[(curves.n_pruned == 0) & (curves.metric == "loss")].value
    assert zero.sub(facts.loss).abs().max() < 1e-6  # float32 sums in another order
    # random rankings differ between seeds (each seed seeds its own ranking)
    imp = pd.read_csv(out / "tables" / "importance.csv")
    rand = imp[imp.method == "random"].pivot_table(
        index=["layer", "head"], columns="seed", values="value"
    )
    assert not rand.iloc[:, 0].equals(rand.iloc[:, 1])
    # the knock-out's unmasked run copies as often as the retrieval step measured
    ko = pd.read_csv(out / "tables" / "knockout.csv")
    assert len(ko) == 1 + 1 + 3
    check_knockout(file, ko)
    timing = pd.read_csv(out / "tables" / "timing.csv")
    pruned = timing[timing.variant == "pruned"]
    assert (pruned.parameters < timing[timing.variant == "original"].parameters.max()).all()
    # timing noise: how much the original's own tokens/s varied over its timings, by hand
    from probe.study.heads.report import read_findings
    from probe.study.heads.steps.timing import timing_noise

    original = timing[timing.variant == "original"].groupby("batch_size").tokens_per_s
    by_hand = {b: v.max() / v.min() - 1 for b, v in original}
    assert timing_noise(read_findings(out).speed) == pytest.approx(by_hand)
    assert "Timing noise: the original's own speed varied by up to" in report

    # a rerun computes nothing; changing the fractions recomputes the curves (and timing) only
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0
    assert "0 steps run" in capsys.readouterr().out
    file.write_text(study_text(llama_dir, "[0.0, 0.5]"))
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    rerun = {s["key"] for s in manifest["steps"] if not s["cached"]}
    assert rerun and all(k.startswith("curve-") or k == "timing" for k in rerun)
    assert exit_code(["study", "report", str(out)]) == 0


def check_knockout(file: Path, ko: pd.DataFrame) -> None:
    """Every knock-out row masks exactly its own heads (no mask left from the run before):
    its copy accuracy is recomputed here with only those heads masked."""
    import tomllib

    from probe.analysis.retrieval import retrieval_scores
    from probe.pruning.heads import masked
    from probe.study.heads.subject import Subject

    subject = Subject(parse_head_study(tomllib.loads(file.read_text())))
    prompts = subject.needles(subject.study.knockout.prompts, seed=1)
    for row in ko.itertuples():
        heads = [] if pd.isna(row.heads) else [
            (int(h[1:].split("H")[0]), int(h.split("H")[1])) for h in row.heads.split()
        ]  # fmt: skip
        assert len(heads) == row.k
        with masked(subject.model, heads):
            accuracy = retrieval_scores(subject.model, prompts)["copy_accuracy"].iloc[0]
        assert accuracy == pytest.approx(row.copy_accuracy), row


def test_bad_head_study_files_are_one_clear_line(tmp_path, capsys):
    base = {"study": {"name": "x", "question": "q?"}, "model": {"source": "bundled:minilm"}}
    cases = [
        ({"curves": {"methods": ["gradiant"]}}, "Did you mean 'gradient'"),
        ({"curves": {"group_methods": ["fisher+tune"]}}, "not by key/value group"),
        ({"knockout": {"heads": [3]}}, "set [roles] needles"),
        ({"text": {"seeds": 0}}, "seeds must be at least 1"),
        ({"timing": {"fractions": [1.5]}}, "fractions must lie strictly between 0 and 1"),
        ({"curves": {"colour": 1}}, "Unknown"),
    ]
    for extra, message in cases:
        with pytest.raises(ProbeError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_head_study({**base, **extra})
    file = tmp_path / "bad.toml"
    file.write_text('[study]\nquestion = "q?"\n[model]\nsource = 3\n')
    assert exit_code(["study", "validate", str(file)]) == 2
    assert "needs a source" in capsys.readouterr().err


def curve(method: str, seed: int, values: list[float], metric: str = "loss") -> list[dict]:
    fractions = [0.0, 0.1, 0.2, 0.3]
    return [{"fraction": f, "method": method, "seed": seed, "metric": metric, "value": v,
             "n_pruned": round(f * 10), "unit": "head"}
            for f, v in zip(fractions, values, strict=True)]  # fmt: skip


def test_operating_point_is_the_last_share_before_the_first_miss():
    rows = curve("a", 0, [2.0, 2.05, 2.3, 2.08]) + curve("a", 1, [2.0, 2.01, 2.09, 2.5])
    ops = operating_points(pd.DataFrame(rows), "causal-lm", tolerance=0.1)
    # seed 0 misses at 0.2 (+0.3) though 0.3 is back within +0.1: the point stays at 0.1
    assert ops.set_index("seed").fraction.to_dict() == {0: 0.1, 1: 0.2}
    sims = curve("b", 0, [1.0, 0.995, 0.99, 0.97], "similarity")
    ops = operating_points(pd.DataFrame(sims), "embedding", tolerance=0.01)
    assert ops.fraction.iloc[0] == 0.2


def test_evidence_by_hand():
    ko = pd.DataFrame([
        {"k": 0, "selection": "none", "draw": 0, "copy_accuracy": 0.9},
        {"k": 2, "selection": "retrieval", "draw": 0, "copy_accuracy": 0.3},
        *({"k": 2, "selection": "random", "draw": d, "copy_accuracy": a}
          for d, a in enumerate([0.8, 0.3, 0.85, 0.9])),
    ])  # fmt: skip
    test = ev.knockout_test(ko).iloc[0]
    assert test.p_value == pytest.approx((1 + 1) / (1 + 4))  # one draw at or below 0.3
    assert (test.random_min, test.random_max) == (0.3, 0.9)
    rows = curve("fisher", 0, [2.0, 2.4, 3.0, 4.0]) + curve("fisher+tune", 0, [2.0, 2.1, 2.5, 3.0])
    rec = ev.tuning_recovery(pd.DataFrame(rows)).set_index("fraction").recovered
    assert rec.to_dict() == pytest.approx({0.1: 0.75, 0.2: 0.5, 0.3: 0.5})
    better = curve("m", 0, [2.0, 2.0, 2.1, 2.2]) + curve("m", 1, [2.0, 2.0, 2.0, 2.1])
    worse = curve("random", 0, [2.0, 2.5, 3.0, 3.5]) + curve("random", 1, [2.0, 2.4, 2.9, 3.6])
    versus = ev.against_random(pd.DataFrame(better + worse), "causal-lm").iloc[0]
    assert versus.p_value == pytest.approx(1 / 6)  # exact: the best of C(4, 2) orderings
    ratios = [0.98, 1.01, 1.02, 0.99, 1.1, 1.2, 1.05, 1.08, 1.3]
    speed = pd.DataFrame({"n_pruned": [4] * 4 + [8] * 5, "speedup": ratios})
    signs = ev.speed_signs(speed).set_index("n_pruned")
    assert signs.faster.to_dict() == {4: 2, 8: 5}
    assert signs.p_sign[4] == pytest.approx(1.0)  # 2 of 4: no direction
    assert signs.p_sign[8] == pytest.approx(2 * 0.5**5)  # all 5 faster, two-sided
    assert signs["median"][8] == pytest.approx(1.1)


def test_timing_reuses_the_importance_it_would_compute(llama_dir):
    """Pruned models built from seed 0's saved importance tables (through CSV, as the runner
    reads them) are the models computing that importance again would build."""
    import io
    import tomllib

    import torch

    from probe.pruning.importance import head_importance
    from probe.pruning.layer_drop import layer_importance
    from probe.study.heads.steps.timing import pruned_model
    from probe.study.heads.subject import Subject

    subject = Subject(parse_head_study(tomllib.loads(study_text(llama_dir))))
    model, split = subject.model, subject.splits[0][0]

    def saved(table):
        return pd.read_csv(io.StringIO(table.to_csv(index=False)))

    known = {m: saved(head_importance(model, split, m, seed=0)) for m in ("gradient", "fisher")}
    known["attention-layer"] = saved(layer_importance(model, split))
    tokens = subject.splits[1][0].inputs
    for method, unit in (("gradient", "head"), ("gradient", "group"), ("fisher+tune", "head"),
                         ("attention-layer", "head")):  # fmt: skip
        again = pruned_model(subject, method, unit, 6)
        reused = pruned_model(subject, method, unit, 6, known)
        assert again.cfg.kept_heads == reused.cfg.kept_heads, method
        with torch.no_grad():
            assert torch.equal(again(tokens), reused(tokens)), method


def test_each_knockout_run_masks_only_its_own_heads(llama_dir, monkeypatch):
    """The copy accuracy a run reports comes from a model with exactly its k heads masked: a
    stand-in scorer returns the number of closed gates instead of an accuracy."""
    import tomllib

    import probe.analysis.retrieval as retrieval
    from probe.study.heads.steps.knockout import knockout
    from probe.study.heads.subject import Subject

    real = retrieval.retrieval_scores

    def closed_gates(model, prompts):
        table = real(model, prompts)
        closed = sum(int((g == 0).sum()) for g in model.gates())
        return table.assign(copy_accuracy=float(closed))

    subject = Subject(parse_head_study(tomllib.loads(study_text(llama_dir))))
    monkeypatch.setattr(retrieval, "retrieval_scores", closed_gates)  # the step imports it then
    table = knockout(subject, {}, {}, lambda done, total: None)
    assert list(table.copy_accuracy) == list(table.k.astype(float))
    assert all((g == 1).all() for g in subject.model.gates())  # and nothing is left masked


def test_only_the_steps_whose_definition_changed_carry_it_in_their_key(plans_only):
    """Wu et al.'s retrieval score and Kwon et al.'s layer-by-layer tuning are in the options
    (so in the cached hash) of exactly the retrieval, knock-out and fisher+tune curve steps:
    a rerun recomputes those and nothing else (the timing step follows its variants)."""
    import tomllib

    from probe.study.heads.steps import plan_steps
    from probe.study.heads.steps.curves import MASK_TUNING
    from probe.study.heads.steps.roles import RETRIEVAL_SCORE

    raw = tomllib.loads(Path("studies/smollm2-heads.toml").read_text())
    steps = [SimpleNamespace(key=k, options=o) for k, _, o in plan_steps(parse_head_study(raw))]
    marked = {s.key for s in steps if {"score", "tune"} & set(s.options)}
    want = {"retrieval", "knockout"} | {f"curve-head-fisher+tune-s{i}" for i in range(3)}
    assert marked == want
    for s in steps:
        if s.key in ("retrieval", "knockout"):
            assert s.options["score"] == RETRIEVAL_SCORE
        if s.key.startswith("curve-"):  # as before, plus the tuning for fisher+tune only
            base = {"method", "unit", "seed", "fractions"}
            assert set(s.options) == base | ({"tune"} if "fisher+tune" in s.key else set())
    assert all(s.options["tune"] == MASK_TUNING for s in steps if "tune" in s.options)


KWON_ABSTRACT = (  # arXiv:2204.09656, abstract (the sentences the report may quote)
    "To retain high accuracy without retraining, we introduce three novel techniques: (i) a "
    "lightweight mask search algorithm that finds which heads and filters to prune based on the "
    "Fisher information; (ii) mask rearrangement that complements the search algorithm; and "
    "(iii) mask tuning that reconstructs the output activations for each layer. We apply our "
    "method to BERT-base and DistilBERT, and we evaluate its effectiveness on GLUE and SQuAD "
    "benchmarks. Our framework achieves up to 2.0x reduction in FLOPs and 1.56x speedup in "
    "inference latency, while maintaining < 1% loss in accuracy."
)


def test_kwon_verdict_quotes_the_abstract_and_compares_like_with_like():
    from types import SimpleNamespace

    from probe.references import published
    from probe.study.heads.claims import kwon

    ref = published("kwon2022")
    assert all(q in KWON_ABSTRACT for q in ref.quotes.values())  # verbatim
    helped = curve("fisher", 0, [2.0, 2.4, 3.0, 4.0]) + curve(
        "fisher+tune", 0, [2.0, 2.1, 2.5, 3.0]
    )
    text = kwon(SimpleNamespace(curves=pd.DataFrame(helped), tolerance=0.1))
    assert "recovers most" not in text
    for q in ref.quotes.values():
        assert repr(q) in text
    assert "in 3 of 3 seed-and-fraction points" in text and "**agrees**" in text
    assert "Not comparable" in text
    mixed = curve("fisher", 0, [2.0, 2.4, 3.0, 4.0]) + curve("fisher+tune", 0, [2.0, 2.5, 2.5, 3.0])
    text = kwon(SimpleNamespace(curves=pd.DataFrame(mixed), tolerance=0.1))
    assert "in 2 of 3" in text and "**inconclusive**" in text


def test_a_retrieval_head_scores_above_the_threshold_and_other_roles_reach_theirs():
    import pandas as pd

    from probe.study.heads import evidence as ev

    roles = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                          "statistic": ["retrieval", "retrieval", "sink", "sink"],
                          "value": [0.1, 0.11, 0.5, 0.49]})  # fmt: skip
    counts = ev.role_counts(roles, n_heads=2).set_index("role")["heads"]
    assert counts["retrieval"] == 1  # Wu et al.: "larger than 0.1"; exactly 0.1 is not
    assert counts["sink"] == 1  # probe's own thresholds are reached (>=)
