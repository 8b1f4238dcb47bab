"""An adversarial pass over cached generation and key/value plans: hand-edited plan.json files,
generate's checks with a plan's cache, the bytes a cache's tensors really hold, and CLI input at
and past its limits; every case failed before its fix."""

from __future__ import annotations

import json

import pytest
import torch
from test_kv_cache import CONFIGS, tiny

from probe.errors import ProbeError
from probe.kv.plan import KVPlan

BASE = {"format": 1, "method": "random", "full_share": 0.5, "sink": 2, "window": 4,
        "full": [[], [1]]}  # fmt: skip


@pytest.mark.parametrize(
    "edit, fragment",
    [
        ({"full": [[-1], []]}, "distinct and >= 0"),
        ({"full": [[1, 1], []]}, "distinct and >= 0"),
        ({"full": [["1"], []]}, "whole number"),
        ({"full": [[1.7], []]}, "whole number"),
        ({"full": [[True], []]}, "whole number"),
        ({"full": "ab"}, "list of lists"),
        ({"sink": 1e400}, "whole number"),
        ({"sink": 2.5}, "whole number"),
        ({"full_share": True}, "must be a number"),
        ({"bogus": 3}, "unknown fields ['bogus']"),
        ({"window": 0}, "window >= 1"),
        ({"format": 2}, "format 1"),
    ],
)
def test_a_hand_edited_plan_is_one_line(tmp_path, edit, fragment):
    (tmp_path / "plan.json").write_text(json.dumps({**BASE, **edit}))
    with pytest.raises(ProbeError, match=r"plan\.json") as err:
        KVPlan.read(tmp_path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_plan_as_written_reads_back(tmp_path):
    plan = KVPlan("random", 0.5, 2, 4, ((), (1,)))
    plan.write(tmp_path / "plan.json")
    assert KVPlan.read(tmp_path) == plan


def _storage_bytes(cache) -> int:
    """Bytes of every distinct storage the cache's tensors keep alive, found by walking them."""
    storages = {}
    for site in cache.sites:
        for t in (site.k, site.v, site.ks, site.vs):
            if t is not None:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("full", [None, ((), ()), ((0,), ())])
def test_cache_bytes_are_the_storage_its_tensors_hold_after_prefill_and_decoding(full):
    model = tiny(**CONFIGS["rope-gqa"])
    plan = None if full is None else KVPlan("random", 0.5, 2, 4, full)
    x = torch.randint(0, 40, (1, 40), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(plan)
    cfg = model.cfg
    with torch.no_grad():
        model(x[:, :30], cache=cache)
        if plan is None:  # 2 sites x (k, v) x kv heads x 30 tokens x d_head x 4 bytes
            assert _storage_bytes(cache) == 2 * 2 * cfg.kv_heads * 30 * cfg.d_head * 4
        assert cache.nbytes == _storage_bytes(cache)
        for i in range(30, 40):
            model(x[:, i : i + 1], cache=cache)
    assert cache.nbytes == _storage_bytes(cache)
    if plan is not None:  # streaming heads hold sink 2 + window 4 tokens, full ones all 40
        kept = sum(len(f) * 40 + (cfg.kv_heads - len(f)) * 6 for f in full)
        assert _storage_bytes(cache) == 2 * kept * cfg.d_head * 4


def test_check_compares_a_plans_cache_with_the_plans_full_forward():
    from probe.measure.generate import generate

    model = tiny(**CONFIGS["rope-gqa"])
    plan = KVPlan("streaming", 0.0, 1, 2, ((), ()))
    tokens = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(0))
    out = generate(model, tokens, 6, check=True, cache=model.new_cache(plan))
    with torch.no_grad():  # greedy by the masked full forward, one token at a time
        seq = tokens
        for _ in range(6):
            seq = torch.cat([seq, model(seq, plan=plan)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, seq)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from test_kv_plan import planted, save

    return save(tmp_path_factory.mktemp("review") / "m", planted())


@pytest.mark.parametrize(
    "command, extra, fragment",
    [
        ("generate", ["--tokens", "99999999999999999999999"], "must lie in 0.."),
        ("generate", ["--tokens", "1", "--temperature", "1", "--seed", "9" * 23], "--seed"),
        ("generate", ["--tokens", "1", "--temperature", "inf"], "finite"),
        ("kv-plan", ["--method", "random", "--seed", "9" * 23], "--seed"),
    ],
)
def test_cli_input_past_its_limits_is_one_line(trained, tmp_path, capsys, command, extra, fragment):
    from cli_run import exit_code

    out = ["--out", str(tmp_path / "o")] if command == "kv-plan" else []
    assert exit_code([command, str(trained), *out, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "Traceback" not in err and len(err.splitlines()) <= 2


def test_tokens_per_second_says_it_includes_the_checks(trained, capsys):
    from cli_run import exit_code

    args = ["generate", str(trained), "--tokens", "1,2", "--max-new-tokens", "3"]
    assert exit_code([*args, "--check"]) == 0
    assert "prefill of 2 tokens and the full-forward checks included" in capsys.readouterr().out
    assert exit_code(args) == 0
    assert "prefill of 2 tokens included" in capsys.readouterr().out


def test_a_plan_on_padded_rows_equals_the_unpadded_row_or_is_refused():
    model = tiny(**CONFIGS["rope-gqa"])
    plan = KVPlan("streaming", 0.0, 2, 3, ((), ()))
    row = torch.randint(1, 40, (1, 10), generator=torch.Generator().manual_seed(2))
    pad = torch.zeros(1, 3, dtype=torch.long)
    real = torch.ones(1, 10, dtype=torch.bool)
    gap = torch.zeros(1, 3, dtype=torch.bool)
    with torch.no_grad():
        alone = model(row, plan=plan)
        right = model(torch.cat([row, pad], 1), key_mask=torch.cat([real, gap], 1), plan=plan)
        assert float((right[:, :10] - alone).abs().max()) <= 1e-5
        left = torch.cat([gap, real], 1)  # the pads would be the sink: refused
        with pytest.raises(ProbeError, match="right-padded"):
            model(torch.cat([pad, row], 1), key_mask=left, plan=plan)
        with pytest.raises(ProbeError, match="right-padded"):
            model(torch.cat([pad, row], 1), key_mask=left, cache=model.new_cache(plan))


def test_a_razor_period_past_learned_positions_names_the_option(tmp_path, capsys):
    from cli_run import exit_code
    from test_kv_plan import save

    from probe.config import ModelConfig
    from probe.model import Transformer

    cfg = ModelConfig(vocab_size=205, n_layer=1, n_head=2, d_model=16, max_len=64, pe="learned")
    ckpt = save(tmp_path / "m", Transformer(cfg))  # 64 learned positions
    args = ["kv-plan", str(ckpt), "--method", "razor", "--rows", "2", "--out", str(tmp_path / "o")]
    assert exit_code([*args, "--period", "32"]) == 2  # 65 tokens
    err = capsys.readouterr().err.strip()
    assert "--period 32" in err and "--period 31 or less" in err and len(err.splitlines()) <= 2
    assert exit_code([*args, "--period", "31"]) == 0


def test_needle_prompts_past_learned_positions_name_the_option(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from cli_run import exit_code
    from test_cli_imported import VOCAB, word_tokenizer

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=16, n_layer=1,
                                  n_head=2)  # fmt: skip
    src = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(src)
    word_tokenizer(False).save(str(src / "tokenizer.json"))
    ckpt = tmp_path / "ckpt"
    assert exit_code(["import", str(src), "--out", str(ckpt)]) == 0
    plan = tmp_path / "plan"
    plan.mkdir()
    KVPlan("streaming", 0.0, 2, 6, ((),)).write(plan / "plan.json")
    capsys.readouterr()
    args = ["eval", str(ckpt), "--kv-plan", str(plan), "--lengths", "16", "--batch-size", "2",
            "--batches", "1", "--needles", "1", "--out", str(tmp_path / "e")]  # fmt: skip
    assert exit_code([*args, "--needle-tokens", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--needle-tokens 64 or less" in err and len(err.splitlines()) <= 2
    assert exit_code([*args, "--needle-tokens", "64"]) == 0


@pytest.mark.parametrize("method, share", [("streaming", 0.0), ("full", 1.0)])
def test_the_manifest_records_the_share_the_plan_has(trained, tmp_path, method, share):
    from cli_run import exit_code

    out = tmp_path / "o"
    args = ["kv-plan", str(trained), "--method", method, "--full-heads", "0.25", "--out", str(out)]
    assert exit_code(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["full_share"] == KVPlan.read(out).full_share == share
