"""Healing by distillation (`probe heal`): the losses against their textbook formulas, the
schedule, a run that lowers the KL and resumes after a kill to the same weights, the shipped
manuals corpus, and bad input as one line."""

from __future__ import annotations

import json
import lzma
import shutil

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from cli_run import exit_code

from probe.checkpoint import load_checkpoint
from probe.data.docs import docs_corpus, docs_path
from probe.data.text import read_documents
from probe.errors import ProbeError
from probe.heal.distill import hidden_sum, kl_sum
from probe.heal.loop import HealConfig, heal
from probe.heal.state import STATE, clear_state
from probe.runtime import Runtime

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny imported Llama (2 layers, 6 query heads in 2 groups) and a third of its heads
    pruned at random; text files to train and measure on."""
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("heal")
    teacher = root / "teacher"
    assert exit_code(["import", str(hf_dir("llama", root)), "--out", str(teacher)]) == 0
    student = root / "student"
    prune = ["prune", str(teacher), "--method", "random", "--fraction", "0.34", "--batch-size",
             "2", "--max-tokens", "16", "--out", str(student)]  # fmt: skip
    assert exit_code(prune) == 0
    docs = read_documents(None)
    (root / "train.txt").write_text("\n".join(docs[:400]) + "\n")
    (root / "heldout.txt").write_text("\n".join(docs[400:]) + "\n")
    return teacher, student, root


def _models():
    from probe.config import ModelConfig
    from probe.model import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=37, n_layer=2, n_head=4, d_model=16, max_len=32, pe="rope")
    return Transformer(cfg).eval(), Transformer(cfg).eval()


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_kl_sum_is_the_kl_of_the_softmaxes_in_any_chunking(temperature):
    teacher, student = _models()
    ids = torch.randint(0, 37, (3, 10))
    ht = teacher.features(ids).flatten(0, 1)
    hs = student.features(ids).flatten(0, 1)
    p = torch.softmax(teacher.logits(ht).double() / temperature, -1)  # [rows, vocab]
    q = torch.softmax(student.logits(hs).double() / temperature, -1)
    expected = (p * (p.log() - q.log())).sum() * temperature**2
    for chunk in (37, 37 * 7, 2**22):  # one row, 7 rows, everything at once
        got = kl_sum(student, teacher, hs, ht, temperature, chunk=chunk)
        assert float(got.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)


def test_kl_sum_gradient_matches_the_direct_formula():
    teacher, student = _models()
    ids = torch.randint(0, 37, (2, 9))
    with torch.no_grad():
        ht = teacher.features(ids).flatten(0, 1)
    log_t = F.log_softmax(teacher.logits(ht), -1)
    log_s = F.log_softmax(student(ids).flatten(0, 1), -1)
    direct = F.kl_div(log_s, log_t, log_target=True, reduction="sum")
    direct.backward()
    want = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    student.zero_grad()
    kl_sum(student, teacher, student.features(ids).flatten(0, 1), ht, chunk=37 * 4).backward()
    for name, grad in want.items():
        torch.testing.assert_close(dict(student.named_parameters())[name].grad, grad,
                                   rtol=1e-4, atol=1e-6)  # fmt: skip


def test_hidden_sum_is_one_minus_cosine_averaged_over_blocks():
    a = [torch.randn(2, 5, 8) for _ in range(3)]
    b = [torch.randn(2, 5, 8) for _ in range(3)]
    mask = torch.rand(2, 5) > 0.3
    per_block = [
        sum(1 - torch.dot(x[i, j], y[i, j]) / (x[i, j].norm() * y[i, j].norm())
            for i in range(2) for j in range(5) if mask[i, j])
        for x, y in zip(a, b, strict=True)
    ]  # fmt: skip
    assert float(hidden_sum(a, b, mask)) == pytest.approx(float(sum(per_block) / 3), rel=1e-5)


def test_features_collects_each_block_output_in_order():
    teacher, _ = _models()
    ids = torch.randint(0, 37, (1, 6))
    seen = []
    teacher.features(ids, collect=seen)
    assert len(seen) == 2
    x = teacher._embed(ids, torch.arange(6).expand(1, 6))
    for block, got in zip(teacher.blocks, seen, strict=True):
        x = block(x, torch.arange(6).expand(1, 6), None)
        torch.testing.assert_close(got, x)


def test_schedule_warms_up_then_holds_or_decays():
    cfg = HealConfig(tokens=10 * 1024, seq_len=64, batch_tokens=1024, lr=1e-3, warmup=0.2)
    assert cfg.steps == 10 and cfg.eval_steps == (1, 2, 4, 8, 10)
    assert [cfg.lr_at(s) for s in range(3)] == pytest.approx([5e-4, 1e-3, 1e-3])
    cosine = HealConfig(tokens=10 * 1024, seq_len=64, batch_tokens=1024, lr=1e-3, warmup=0.2,
                        schedule="cosine")  # fmt: skip
    assert cosine.lr_at(2) == pytest.approx(1e-3)
    assert cosine.lr_at(5) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + torch.cos(torch.tensor(
        torch.pi * 3 / 7)).item()))  # fmt: skip
    assert cosine.lr_at(9) == pytest.approx(1e-4)  # a tenth at the last step
    assert HealConfig(tokens=10 * 1024, seq_len=64, batch_tokens=1024,
                      eval_at=(1, 3)).eval_steps == (1, 3, 10)  # the trained model too  # fmt: skip


@pytest.mark.parametrize(
    "options, words",
    [
        ({"tokens": 100, "batch_tokens": 1024}, "less than one optimizer step"),
        ({"tokens": 4096, "batch_tokens": 32, "seq_len": 64}, "less than one row"),
        ({"tokens": 20000, "lr": 0.0}, "--lr"),
        ({"tokens": 20000, "warmup": 1.0}, "--warmup"),
        ({"tokens": 20000, "schedule": "linear"}, "Unknown --schedule"),
        ({"tokens": 4096, "seq_len": 64, "batch_tokens": 1024, "eval_at": (0, 2)}, "1..4"),
        ({"tokens": 0}, "--tokens must be"),
    ],
)
def test_bad_settings_are_one_line(options, words):
    with pytest.raises(ProbeError, match=words):
        HealConfig(**options)


def _run(pair, out, cfg, stop_at=None):
    teacher_dir, student_dir, root = pair
    teacher = load_checkpoint(teacher_dir)
    student = load_checkpoint(student_dir)

    def progress(p):
        if stop_at is not None and p.step == stop_at and not p.note:
            raise KeyboardInterrupt  # a kill between two steps

    result = heal(teacher.model, student.model, read_documents(root / "train.txt"),
                  read_documents(root / "heldout.txt"), student.tokenizer(), cfg, out,
                  Runtime.cpu(), max_batch_tokens=64, identity={"x": 1},
                  progress=progress)  # fmt: skip
    return student.model, result


def test_a_killed_run_resumes_to_the_same_weights(pair, tmp_path):
    cfg = HealConfig(tokens=6 * 128, seq_len=16, batch_tokens=128, lr=3e-3, eval_tokens=64,
                     eval_at=(2, 4, 6))  # fmt: skip
    whole, result = _run(pair, tmp_path / "whole", cfg)
    with pytest.raises(KeyboardInterrupt):
        _run(pair, tmp_path / "killed", cfg, stop_at=3)
    assert json.loads((tmp_path / "killed" / STATE / "state.json").read_text())["step"] == 2
    resumed, again = _run(pair, tmp_path / "killed", cfg)
    assert again.resumed_at == 2
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    pd.testing.assert_frame_equal(result.table, again.table)
    (tmp_path / "killed" / STATE / "notes.txt").write_text("mine")
    clear_state(tmp_path / "killed")  # removes heal's files only
    assert [p.name for p in (tmp_path / "killed" / STATE).iterdir()] == ["notes.txt"]
    table = result.table.set_index(["stage", "tokens", "metric"]).value
    assert list(result.losses.step) == [1, 2, 3, 4, 5, 6]
    assert result.losses.kl.iloc[-1] < result.losses.kl.iloc[0]  # distillation lowers the KL
    original = table["original", 0, "loss"]  # the student moves toward the teacher's loss
    assert abs(table["healed", 6 * 128, "loss"] - original) < abs(
        table["pruned", 0, "loss"] - original
    )
    with pytest.raises(KeyboardInterrupt):
        _run(pair, tmp_path / "other", cfg, stop_at=3)
    changed = HealConfig(**{**cfg.to_dict(), "lr": 1e-3, "eval_at": (2, 4, 6)})
    with pytest.raises(ProbeError, match=r"other settings \(lr"):
        _run(pair, tmp_path / "other", changed)


def test_heal_cli_writes_a_healed_checkpoint_and_its_table(pair, tmp_path):
    teacher, student, root = pair
    out = tmp_path / "healed"
    args = ["heal", str(student), "--teacher", str(teacher), "--tokens", "512", "--seq-len",
            "16", "--batch-tokens", "128", "--eval-tokens", "64", "--lr", "3e-3", "--text",
            str(root / "train.txt"), "--eval-text", str(root / "heldout.txt"), "--device",
            "cpu", "--out", str(out)]  # fmt: skip
    assert exit_code(args) == 0
    table = pd.read_csv(out / "heal.csv")
    assert list(table.columns) == ["stage", "tokens", "metric", "value"]
    assert set(table.stage) == {"original", "pruned", "healed"}
    assert sorted(set(table.tokens[table.stage == "healed"])) == [128, 256, 512]
    healed = load_checkpoint(out)
    assert healed.model_cfg == load_checkpoint(student).model_cfg  # same heads, new weights
    assert healed.meta["healed"]["tokens"] == 512
    assert (out / "heal.png").stat().st_size > 0 and (out / "tokenizer.json").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["trained_tokens"] == 512
    assert exit_code(args) == 2  # the results are there: --overwrite to replace them
    assert not (out / STATE).exists()
    before = (out / "model.safetensors").read_bytes()
    diverging = [*args, "--overwrite", "--lr", "1e30"]
    assert exit_code(diverging) == 2  # diverges: one line, and the earlier results are kept
    assert (out / "model.safetensors").read_bytes() == before
    assert (out / "heal.csv").is_file() and (out / "manifest.json").is_file()


def test_bad_input_is_one_line(pair, tmp_path, capsys):
    teacher, student, root = pair
    other_vocab = tmp_path / "other-vocab"
    shutil.copytree(teacher, other_vocab)
    tok = json.loads((other_vocab / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first, second = list(vocab)[5:7]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other_vocab / "tokenizer.json").write_text(json.dumps(tok))
    from test_cli_imported import hf_dir

    bert = tmp_path / "bert"
    assert exit_code(["import", str(hf_dir("bert-mlm", tmp_path)), "--out", str(bert)]) == 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    other = tmp_path / "other"  # the same shape, other weights, pruned alike
    assert exit_code(["import", str(hf_dir("llama", tmp_path / "o")), "--out", str(other)]) == 0
    from probe.checkpoint import load_checkpoint as load
    from probe.checkpoint import save_checkpoint

    o = load(other)
    with torch.no_grad():
        o.model.embed.weight.normal_()
    save_checkpoint(other, o.model, None, None, source=o.source, tokenizer=o.tokenizer())
    damaged = tmp_path / "damaged"
    (damaged / STATE).mkdir(parents=True)
    (damaged / STATE / "state.json").write_text("[]")
    base = ["--tokens", "128", "--seq-len", "16", "--batch-tokens", "128"]
    cases = [
        ([str(student), "--teacher", str(other_vocab)], "different vocabularies"),
        ([str(bert), "--teacher", str(teacher)], "not an imported causal language model"),
        ([str(teacher), "--teacher", str(student)], "not a pruned copy"),
        ([str(student), "--teacher", str(teacher), "--out", str(blocker / "x")], "is a file"),
        (
            [
                str(student),
                "--teacher",
                str(teacher),
                "--text",
                str(root / "train.txt"),
                "--eval-text",
                str(root / "train.txt"),
            ],
            "same file",
        ),
        ([str(student), "--teacher", str(tmp_path / "none")], "tmp"),
        ([str(student), "--teacher", str(teacher), "--eval-at", "x"], "--eval-at"),
        (
            [str(teacher), "--teacher", str(teacher), "--out", str(tmp_path / "o2")],
            "nothing was pruned",
        ),
        ([str(student), "--teacher", str(other)], "was not pruned from the teacher"),
        ([str(student), "--teacher", str(teacher), "--dtype", "float16"], "float32 or bfloat16"),
        ([str(student), "--teacher", str(teacher), "--out", str(damaged)], "not a heal resume"),
    ]
    for args, words in cases:
        capsys.readouterr()
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "out")]
        assert exit_code(["heal", *base, *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert words in err.replace("\n", " ") and "Traceback" not in err, (args, err)


def test_the_manuals_corpus_is_two_disjoint_parts_of_enough_text():
    train, heldout = docs_corpus("train"), docs_corpus("heldout")
    assert len(train) == 1421 and len(heldout) == 147
    assert not set(train) & set(heldout)
    chars = sum(map(len, train)) + sum(map(len, heldout))
    assert chars > 9_700_000  # ~4.7 characters a SmolLM2 token: over 2M tokens
    raw = lzma.decompress(docs_path("train").read_bytes()).decode()
    assert raw.isascii() or "\x00" not in raw
    with pytest.raises(ProbeError, match="Unknown part"):
        docs_corpus("test")
