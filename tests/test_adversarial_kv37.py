"""An adversarial pass over issue 37's key/value plans, statistics and held-out text: the defects
it found (a NaN seed read as support, compensation at sliding-window sites, uncounted bytes, a
prefill store shared across models, unit-dependent tolerances, odd chunk digits, huge numbers in
plan.json, --set keys named as flags, study options checked late), each fixed and kept here, and
edge cases that held, each against an independent computation (a full forward with explicit
masks, a brute-force n-gram check)."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from test_kv_apply import plan_of
from test_kv_prefill import PLANS, PROMPT, SEQ, TOKENS, by_cache, by_full_forward, model_of
from test_paired_contrast import arms, contrast

from probe.errors import ProbeError
from probe.kv.evaluate import Prefill, Prefills, prefilled
from probe.kv.plan import KVPlan
from probe.study.verdicts.contrast import evaluate
from probe.study.verdicts.stats import mann_whitney, sign_flip

NAN = float("nan")


# ---------------------------------------------------------------------------- paired contrasts
@pytest.mark.parametrize("paired", [(), ("seed",)], ids=["unpaired", "paired"])
def test_a_nan_seed_never_supports_a_claim(paired):
    # a is below b on every seed it has a number for; seed 2 of a is NaN (a diverged run)
    a = [0.0, 1.0, NAN, 3.0, 4.0, 5.0]
    b = [v + 1.0 for v in range(6)]
    more = {"paired": paired} if paired else {}
    row = evaluate(contrast(**more), arms(a, b)).iloc[0]
    assert row["verdict"] != "supported"
    assert not row["p_claim"] <= 0.05


def test_the_tests_never_return_zero_for_nan():
    for p in (sign_flip([1.0, NAN], [0.0, 0.0], "greater"),
              mann_whitney([1.0, NAN], [0.0, 0.0], "greater")):  # fmt: skip
        assert not p < 0.1  # 2 pairs cannot go below 0.25, 2 against 2 below 1/6 (NaN: no p)


def test_the_sign_flip_p_does_not_depend_on_the_units():
    d = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0])  # all positive: 2^-8
    for scale in (1.0, 1e-10):
        assert sign_flip(d * scale, np.zeros(8), "greater") == pytest.approx(2.0**-8)


# ------------------------------------------------------------------------- compensation token
@pytest.mark.parametrize("prefill", [Prefill("masked"), Prefill("full")], ids=["masked", "full"])
def test_compensation_at_a_sliding_window_site_is_the_full_forward_or_refused(prefill):
    model = model_of("window")  # layer 0: a sliding window of 3
    plan = dataclasses.replace(plan_of([(), (0, 1)], sink=1, window=2), compensate=True)
    try:
        model.new_cache(plan)
    except ProbeError:
        return  # refused, as compensation is for score biases
    got, _ = by_cache(model, plan, prefill)
    if prefill.mode == "masked":
        with torch.no_grad():
            want = model(TOKENS, plan=plan)[0, PROMPT - 1 :]
    else:
        want = by_full_forward(model, plan, lambda p: p if p >= PROMPT else 0)[PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_compensation_token_counts_in_the_bytes_held():
    model = model_of("rope-gqa")
    plain = by_cache(model, PLANS[2], Prefill("full"))[1]
    folded = by_cache(model, dataclasses.replace(PLANS[2], compensate=True), Prefill("full"))[1]
    assert folded.sites[0].dropped is not None  # keys were dropped and folded
    assert folded.nbytes > plain.nbytes


# -------------------------------------------------------------------------------- kept prefills
def test_a_kept_prefill_is_never_another_models():
    first, second = model_of("rope-gqa"), model_of("rope-gqa")
    with torch.no_grad():
        for p in second.parameters():
            p.mul_(0.5)
        kept = Prefills(budget=2**30)
        prefilled(first, TOKENS[0, :PROMPT], None, Prefill("full"), kept)
        with pytest.raises(ValueError, match="another model's"):  # refused, never reused
            prefilled(second, TOKENS[0, :PROMPT], None, Prefill("full"), kept)


# ------------------------------------------------------------------------- edges that held
def test_chunks_of_one_with_a_buffer_and_the_token_are_cut_after_each_call():
    model = model_of("rope-gqa")
    plan = dataclasses.replace(PLANS[0], buffer_ratio=3.0, compensate=True)
    got, _ = by_cache(model, plan, Prefill("chunked", 1))
    want = by_full_forward(model, plan, lambda p: p)[PROMPT - 1 :]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefill", [Prefill("full"), Prefill("chunked", 100), Prefill("masked")],
                         ids=["full", "chunk-past-prompt", "masked"])  # fmt: skip
def test_a_window_past_the_sequence_is_the_full_model(prefill):
    model = model_of("rope-gqa")
    plan = dataclasses.replace(plan_of([(), ()], sink=0, window=SEQ + 1), compensate=True)
    got, cache = by_cache(model, plan, prefill)
    with torch.no_grad():
        torch.testing.assert_close(got, model(TOKENS)[0, PROMPT - 1 :], atol=1e-5, rtol=1e-5)
    assert all(site.dropped is None for site in cache.sites)  # nothing dropped, no token


def test_a_cut_after_decoding_is_a_prefill_of_everything_so_far():
    model, plan, upto = model_of("rope-gqa"), PLANS[0], PROMPT + 3
    with torch.no_grad():
        full = model.new_cache()
        model(TOKENS[:, :PROMPT], cache=full)
        for i in range(PROMPT, upto):
            model(TOKENS[:, i : i + 1], cache=full)
        cut = full.cut(model.stream_rules(plan, masked=False), plan)
        got = torch.cat([model(TOKENS[:, i : i + 1], cache=cut)[0] for i in range(upto, SEQ)])
    want = by_full_forward(model, plan, lambda p: p if p >= upto else 0)[upto:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert full.length == upto  # the full cache was left as it was


# ------------------------------------------------------------------------- flags and plan files
@pytest.mark.parametrize("text", ["chunked:²", "chunked:" + "9" * 23])
def test_odd_chunk_digits_are_one_line(text):
    from probe_cli.kv_eval import parse_prefill

    try:
        prefill = parse_prefill(text)
    except ProbeError:
        return
    prefilled(model_of("rope-gqa"), TOKENS[0, :PROMPT], PLANS[0], prefill)


def test_a_huge_buffer_ratio_in_plan_json_is_one_line(tmp_path):
    data = KVPlan("razor", 0.1, 4, 8, ((0,), ())).to_dict()
    (tmp_path / "plan.json").write_text(json.dumps({**data, "buffer_ratio": 10**400}))
    with pytest.raises(ProbeError, match="buffer_ratio"):
        KVPlan.read(tmp_path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from cli_run import exit_code
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("adv37")
    source = hf_dir("llama", root)
    ckpt = root / "llama-ckpt"
    assert exit_code(["import", str(source), "--out", str(ckpt)]) == 0
    return source, ckpt


def test_a_bad_set_value_names_the_set_key(llama, tmp_path, capsys):
    from cli_run import exit_code

    capsys.readouterr()
    args = ["kv-plan", str(llama[1]), "--out", str(tmp_path / "p"), "--method", "razor",
            "--set", "echo_ratio=-1"]  # fmt: skip
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    assert "--echo-ratio" not in err and "echo_ratio" in err


def test_a_study_razor_buffer_ratio_below_one_is_refused_before_any_step(llama, tmp_path, capsys):
    from cli_run import exit_code
    from test_kv_study import kv_study_text

    text = kv_study_text(llama[0], '["razor"]').split("[[")[0]
    file = tmp_path / "kv.toml"
    file.write_text(text.replace("duo_steps = 2", "razor_buffer_ratio = 0.5"))
    capsys.readouterr()
    out = tmp_path / "out"
    assert exit_code(["study", "run", str(file), "--out", str(out)]) == 2
    assert "razor_buffer_ratio" in capsys.readouterr().err
    assert not list(out.glob("steps/*/done.json"))  # nothing measured before the refusal


# ------------------------------------------------------------------------------ held-out text
def test_held_out_passages_share_no_ngram_and_are_runs_of_their_page():
    """Random pages of a 9-word vocabulary (accents, closers, no end punctuation at times),
    pages shorter than n, a held-out page copied from training: checked by brute force."""
    from probe.heal.heldout import ngram_set, select

    rng = random.Random(0)
    vocab = ["a", "b", "c", "d.", "é", "ß!", "x?", "(y.)", "z:"]

    def page(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    for trial in range(150):
        n = rng.choice([2, 3, 4, 13])
        train = [page(rng.randint(0, 40)) for _ in range(3)]
        held = [page(rng.randint(0, 40)) for _ in range(4)] + [train[0][: rng.randint(0, 60)]]
        projects = [rng.choice("pq") for _ in held]
        seen = {tuple(t.split()[i : i + n]) for t in train
                for i in range(len(t.split()) - n + 1)}  # fmt: skip
        sample = select(held, projects, ngram_set(train, n), trial, n, rng.randint(1, 10))
        for cleaned, text in zip(sample.pages, held, strict=True):
            words = text.split()
            for passage in cleaned.passages:
                w = passage.split()
                assert not any(tuple(w[i : i + n]) in seen for i in range(len(w) - n + 1))
                assert any(words[i : i + len(w)] == w for i in range(len(words)))
            kept = sum(len(p.split()) for p in cleaned.passages)
            assert kept + cleaned.words_dropped == cleaned.words == len(words)
        every = [(i, k) for i, p in enumerate(sample.pages) for k in range(len(p.passages))]
        assert sorted(sample.order) == every
