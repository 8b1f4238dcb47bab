"""Adversarial input to the key/value-cache commands (issue 36): `probe kv-plan`, `probe eval
--kv-plan`, `probe generate`, the newer families' config fields at import, and the [kv] section
of head studies. Each case is one line and exit code 2 naming the file or option, before any
output is written; what is accepted computes what it should (sampling at a vanishing temperature
is greedy decoding; a window past int64 is refused as transformers cannot run it)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from cli_run import exit_code

from probe.errors import ProbeError
from probe.kv.plan import KVPlan

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

GOOD = {"format": 1, "method": "streaming", "full_share": 0.0, "sink": 2, "window": 4,
        "full": [[], []]}  # fmt: skip


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """An imported 2-layer Llama (6 query heads in 2 key/value groups, rotary: no position
    limit) and its Hugging Face source directory."""
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("adv-kv")
    source = hf_dir("llama", root)
    ckpt = root / "llama-ckpt"
    assert exit_code(["import", str(source), "--out", str(ckpt)]) == 0
    return ckpt, source


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def plan_dir(path, raw: str | bytes):
    path.mkdir()
    data = raw.encode() if isinstance(raw, str) else raw
    (path / "plan.json").write_bytes(data)
    return path


GOOD_TEXT = json.dumps(GOOD)
DAMAGED = [
    # an integer of more digits than Python converts (ValueError, was a crash)
    ("bigint", GOOD_TEXT.replace('"sink": 2', '"sink": ' + "9" * 5000), "not a readable plan"),
    # arrays nested past the recursion limit (RecursionError, was a crash)
    ("deep", "[" * 100_000 + "]" * 100_000, "not a readable plan"),
    # json keeps the last of a repeated key silently (was a misleading site-count error)
    ("repeated", GOOD_TEXT[:-1] + ', "full": [[0]]}', "'full' appears twice"),
    ("format-true", GOOD_TEXT.replace('"format": 1', '"format": true'), "not a plan.json"),
    # past int64 in torch's index arithmetic (OverflowError, was a crash)
    ("sink-huge", GOOD_TEXT.replace('"sink": 2', f'"sink": {10**30}'), "sink 10000"),
    ("window-huge", GOOD_TEXT.replace('"window": 4', f'"window": {2**63}'), "window 9223"),
    ("binary", os.urandom(512), "not a readable plan"),
    ("full-of-strings", GOOD_TEXT.replace('[[], []]', '[["0"], []]'), "wrong type"),
    ("heads-out-of-range", GOOD_TEXT.replace('[[], []]', '[[7], []]'), "no key/value heads [7]"),
    ("another-model", GOOD_TEXT.replace('[[], []]', '[[], [], []]'), "lists 3 attention sites"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "raw", "needle"), DAMAGED, ids=[c[0] for c in DAMAGED])
def test_a_damaged_plan_is_one_line_in_generate(llama, tmp_path, capsys, case, raw, needle):
    plan = plan_dir(tmp_path / case, raw)
    code = exit_code(["generate", str(llama[0]), "--tokens", "5,6,7", "--max-new-tokens", "2",
                      "--kv-plan", str(plan)])  # fmt: skip
    err = one_line(capsys)
    assert code == 2 and needle in err, err


def test_a_plan_that_is_a_fifo_or_a_folder_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "plan.json")  # reading it would wait forever for a writer
    with pytest.raises(ProbeError, match="named pipe"):
        KVPlan.read(fifo)
    folder = tmp_path / "folder"
    (folder / "plan.json").mkdir(parents=True)
    with pytest.raises(ProbeError, match="is a directory"):
        KVPlan.read(folder)


def test_sink_and_window_are_bounded_where_a_plan_is_made():
    KVPlan("streaming", 0.0, 2**40, 2**40, ())  # the largest: accepted
    for sink, window in ((2**40 + 1, 4), (4, 10**30)):
        with pytest.raises(ProbeError, match="past the most tokens a plan counts"):
            KVPlan("streaming", 0.0, sink, window, ())


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--method", "random", "--sink", str(10**30)], "sink 1000"),
        (["--method", "random", "--window", str(2**63)], "window 9223"),
        (["--method", "duo", "--lr", "inf"], "finite"),  # was: every gate NaN, a plan of noise
        (["--method", "duo", "--l1", "inf"], "finite"),
        (["--method", "razor", "--rows", str(10**12)], "--rows"),  # was: a 512 TB allocation
        (["--method", "retrieval", "--needles", str(10**9)], "needle prompts"),  # was: a hang
    ],
)
def test_kv_plan_refuses_impossible_options_before_writing(llama, tmp_path, capsys, options,
                                                           needle):  # fmt: skip
    out = tmp_path / "plan"
    code = exit_code(["kv-plan", str(llama[0]), *options, "--out", str(out)])
    err = one_line(capsys)
    assert code == 2 and needle in err, err
    assert not out.exists()


def test_duo_settings_refuse_infinite_rates():
    from probe.kv.methods.duo import DuoSettings

    for settings in (DuoSettings(lr=float("inf")), DuoSettings(l1=float("inf")),
                     DuoSettings(lr=float("nan"))):  # fmt: skip
        with pytest.raises(ProbeError, match="finite"):
            settings.check()


@pytest.mark.parametrize("where", ["is", "holds"])
def test_eval_never_writes_into_or_over_its_plan(llama, tmp_path, capsys, where):
    plan = tmp_path / "plans" / "p"
    plan.mkdir(parents=True)
    KVPlan("streaming", 0.0, 2, 6, ((), ())).write(plan / "plan.json")
    (plan / "manifest.json").write_text('{"command": "kv-plan"}\n')
    before = {p.name: p.read_bytes() for p in plan.iterdir()}
    out = plan if where == "is" else plan.parent
    code = exit_code(["eval", str(llama[0]), "--kv-plan", str(plan), "--out", str(out),
                      "--overwrite", "--lengths", "16", "--needle-tokens", "64"])  # fmt: skip
    err = one_line(capsys)
    assert code == 2 and f"{where} --kv-plan" in err, err
    assert {p.name: p.read_bytes() for p in plan.iterdir()} == before  # kv-plan's manifest kept


def test_eval_refuses_needle_counts_it_cannot_hold(llama, tmp_path, capsys):
    plan = tmp_path / "p"
    plan.mkdir()
    KVPlan("streaming", 0.0, 2, 6, ((), ())).write(plan / "plan.json")
    code = exit_code(["eval", str(llama[0]), "--kv-plan", str(plan), "--out", str(tmp_path / "o"),
                      "--needles", str(10**12)])  # fmt: skip
    assert code == 2 and "needle prompts" in one_line(capsys)


def test_sampling_at_a_vanishing_temperature_is_greedy_decoding(llama):
    """softmax(logits / T) tends to the argmax as T -> 0; T = 1e-45 overflowed logits / T to
    inf (NaN probabilities, a crash in multinomial); T = 5e-324 is the smallest double."""
    from probe.checkpoint import load_checkpoint
    from probe.measure.generate import generate

    model = load_checkpoint(llama[0]).model
    prompt = torch.tensor([[5, 17, 3, 40]])
    greedy = generate(model, prompt, 8)
    for t in (1e-45, 5e-324):
        assert torch.equal(generate(model, prompt, 8, greedy=False, temperature=t), greedy)


@pytest.mark.parametrize(
    "options",
    [
        ["--prompt", "the", "--max-new-tokens", str(10**9)],  # was: ran until memory ran out
        ["--prompt", "the", "--max-new-tokens", "100000", "--check"],  # full forwards of 100k
        ["--tokens", ",".join(["5"] * 200_000), "--max-new-tokens", "1"],  # was: a 320 GB alloc
    ],
    ids=["new-tokens", "checked", "prompt"],
)
def test_generate_refuses_what_memory_cannot_hold_before_starting(llama, capsys, options):
    code = exit_code(["generate", str(llama[0]), *options])
    err = one_line(capsys)
    assert code == 2 and "would need about" in err and "--max-new-tokens" in err, err


def test_the_generation_estimate_covers_the_cache_it_allocates(llama, monkeypatch):
    """The cache part of the estimate against the bytes a real decode allocated (a plan whose
    streaming heads hold only sink + window): at least those, at most 4 times as many."""
    from probe.checkpoint import load_checkpoint
    from probe.measure import memory
    from probe.measure.generate import check_memory, generate

    model = load_checkpoint(llama[0]).model
    prompt = torch.tensor([[5, 17, 3, 40]])
    plan = KVPlan("streaming", 0.0, 2, 6, ((0,), ()))
    seen = []
    monkeypatch.setattr(memory, "check_fits", lambda need, *a, **k: seen.append(need))
    check_memory(model, prompt, 60, False, plan)
    estimate = seen[0] - memory.forward_bytes(model.cfg, 1, 4)  # the prefill's share
    cache = model.new_cache(plan)
    generate(model, prompt, 60, cache=cache)
    assert cache.nbytes <= estimate <= 4 * cache.nbytes


def hf_family(kind: str, root, change: dict):
    from family_models import save_tiny

    path = save_tiny(kind, root)
    config = json.loads((path / "config.json").read_text())
    config.update(change)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("kind", "change", "needle"),
    [
        # transformers fails its forward ("Overflow when unpacking long long"); probe imported it
        ("gemma2", {"sliding_window": 10**30}, "sliding_window must be"),
        ("phi3", {"sliding_window": 10**30}, "sliding_window must be"),
        (
            "qwen3",
            {
                "use_sliding_window": True,
                "sliding_window": 10**30,
                "layer_types": ["sliding_attention", "full_attention"],
            },
            "sliding_window must be",
        ),
        # ModelConfig's own check named neither the file nor the key
        (
            "gemma2",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 0.5}},
            "rope_parameters.rope_theta",
        ),
    ],
    ids=["gemma2-window", "phi3-window", "qwen3-window", "gemma2-theta"],
)
def test_import_names_the_file_and_key_of_an_impossible_field(tmp_path, capsys, kind, change,
                                                               needle):  # fmt: skip
    source = hf_family(kind, tmp_path, change)
    capsys.readouterr()  # transformers' progress bar while saving the source
    out = tmp_path / "ckpt"
    code = exit_code(["import", str(source), "--out", str(out)])
    err = one_line(capsys)
    assert code == 2 and needle in err and "config.json" in err, err
    assert not out.exists()


def test_import_keeps_a_large_window_transformers_runs(tmp_path):
    """A window longer than any input is no window: the same logits as transformers'."""
    import transformers

    from probe.interop.importer import import_model

    source = hf_family("gemma2", tmp_path, {"sliding_window": 2**40})
    ours = import_model(source).model
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(source)).eval()
    tokens = torch.randint(0, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = (ours(tokens) - ref(tokens).logits).abs().max()
    assert gap < 1e-4


STUDY = """
[study]
name = "adv-kv"
title = "adversarial kv"
question = "Is the [kv] section checked?"

[model]
source = "{source}"

[text]
max_tokens = 32
batch_size = 2
batches = 1
seeds = 1

[kv]
methods = ["razor", "random"]
full_shares = [0.5]
sink = 2
window = 8
lengths = [96]
needles = 1
seeds = 1
loss_tokens = 32
loss_rows = 1
razor_period = 8
razor_rows = 2
"""


@pytest.mark.parametrize(
    ("command", "old", "new", "needle"),
    [
        ("validate", "sink = 2", f"sink = {2**63 - 1}", "[kv] sink must be at least 0 and"),
        ("validate", "window = 8", f"window = {2**62}", "[kv] window must be at least 1 and"),
        ("validate", "razor_rows = 2", "razor_rows = 2\nduo_lr = inf", "finite"),
        # the fit check made the prompt before any memory check: a hang
        ("run", "lengths = [96]", f"lengths = [{10**12}]", "[kv] (prompts of up to"),
        ("run", "needles = 1", f"needles = {10**12}", "[kv] (prompts of up to"),
        ("run", "razor_rows = 2", f"razor_rows = {10**12}", "razor_rows"),
    ],
    ids=["sink", "window", "duo-lr", "lengths", "needles", "razor-rows"],
)
def test_a_kv_section_past_what_can_run_is_one_line(llama, tmp_path, capsys, command, old, new,
                                                     needle):  # fmt: skip
    text = STUDY.format(source=llama[1])
    assert old in text
    study = tmp_path / "s.toml"
    study.write_text(text.replace(old, new))
    out = tmp_path / "runs"
    args = ["study", command, str(study)] + (["--out", str(out)] if command == "run" else [])
    code = exit_code(args)
    err = one_line(capsys)
    assert code == 2 and needle in err, err
    assert not (out / "steps").exists()


def test_two_runs_given_one_out_do_not_replace_each_others_results(tmp_path):
    """Both claim the empty folder; the first to finish writes; the second, finding results it
    did not see at its claim, writes nothing and says so (before: it replaced them silently)."""
    from probe.files import claim_output, open_output

    out = tmp_path / "out"
    first = claim_output(out, ("eval.csv", "manifest.json"))
    second = claim_output(out, ("eval.csv", "manifest.json"))
    (open_output(out, first) / "eval.csv").write_text("the first run's table\n")
    with pytest.raises(ProbeError, match=r"received eval\.csv from another run"):
        open_output(out, second)
    assert (out / "eval.csv").read_text() == "the first run's table\n"
    again = claim_output(out, ("eval.csv", "manifest.json"), overwrite=True)  # asked: replaced
    open_output(out, again)
    assert not (out / "eval.csv").exists()


def test_a_plan_of_another_model_is_refused_naming_its_file(tmp_path):
    """A plan.json whose key/value head ids the model does not have: one line naming the file
    (it said only "the plan"), and a plan made in memory still says "the plan"."""
    from probe.config import ModelConfig
    from probe.model import Transformer

    model = Transformer(ModelConfig(vocab_size=8, n_layer=1, n_head=4, n_kv_head=2, d_model=16))
    written = KVPlan("random", 0.5, 1, 2, ((0, 5),)).write(tmp_path / "plan.json")
    with pytest.raises(ProbeError, match=rf"the plan {tmp_path}/plan\.json: .*has no key/value "
                       r"heads \[5\] \(it keeps \[0, 1\]\)"):  # fmt: skip
        model.stream_rules(KVPlan.read(written))
    with pytest.raises(ProbeError, match=r"^the plan: "):
        model.stream_rules(KVPlan("random", 0.5, 1, 2, ((0, 5),)))
    assert KVPlan.read(written) == KVPlan("random", 0.5, 1, 2, ((0, 5),))  # the file is no part
