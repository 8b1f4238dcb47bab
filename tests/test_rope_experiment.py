"""Rotary scaling as an experiment: a rotary model run, training-free, with a scaling it was not
trained with (`probe.model.rescale.with_rope_scaling`; `--rope-*` on eval, inspect, generate and
view; `[model] rope_scaling` in head studies). Linear scaling divides positions by its factor,
so the scaled model is checked against the unscaled one fed positions / factor; every other
kind against a model built with the scaling in its config; imported models against
transformers."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pandas as pd
import pytest
import torch
from cli_run import exit_code
from probe_cli.main import app
from typer.testing import CliRunner

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches, form_for
from probe.model import Transformer
from probe.model.rescale import with_rope_scaling
from probe.rope import RopeScaling
from probe.rope_experiment import RopeRequest, training_context
from probe.train_config import TrainConfig

TASK = TaskConfig(name="copy", n_symbols=6)
LINEAR2 = RopeScaling("linear", factor=2.0)


def rope_model(**changes) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=2, d_model=32, pe="rope",
                      rope_base=100.0, **changes)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper attention than at initialization: positions matter
        for attn in model.attention_modules():
            attn.q.weight.mul_(4.0)
            attn.k.weight.mul_(4.0)
    return model


def logits_at(model: Transformer, tokens: torch.Tensor, positions=None) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens, positions=positions)  # [batch, seq, vocab]


# ------------------------------------------------------------------ the library function
def test_linear_scaling_is_the_unscaled_model_at_positions_over_the_factor():
    model = rope_model()
    tokens = torch.randint(0, TASK.vocab_size, (2, 24))  # [batch, seq]
    halved = (torch.arange(24, dtype=torch.float32) / 2).expand(2, -1)  # [batch, seq]
    expected = logits_at(model, tokens, halved)
    plain = logits_at(model, tokens)
    scaled = with_rope_scaling(copy.deepcopy(model), LINEAR2)
    got = logits_at(scaled, tokens)
    assert (got - expected).abs().max().item() < 1e-5
    assert (plain - expected).abs().max().item() > 1e-2  # the scaling changed something
    assert scaled.cfg.rope_scaling == LINEAR2 and model.cfg.rope_scaling.plain


@pytest.mark.parametrize("scaling", [
    RopeScaling("yarn", factor=4.0, original_max_position_embeddings=8),
    RopeScaling("dynamic", factor=2.0, max_position_embeddings=8),
    RopeScaling("llama3", factor=4.0, original_max_position_embeddings=8, low_freq_factor=1.0,
                high_freq_factor=4.0),
    RopeScaling("ntk", alpha=3.0),
], ids=lambda s: s.kind)  # fmt: skip
def test_rescaled_model_is_the_model_built_with_that_scaling(scaling):
    model = rope_model(rope_fraction=0.5)
    built = Transformer(dataclasses.replace(model.cfg, rope_scaling=scaling)).eval()
    built.load_state_dict(model.state_dict())
    tokens = torch.randint(0, TASK.vocab_size, (2, 20))  # [batch, seq] longer than 8
    got = logits_at(with_rope_scaling(model, scaling), tokens)
    assert torch.equal(got, logits_at(built, tokens))


def test_the_sliding_window_layers_keep_their_own_rotary():
    local = RopeScaling("linear", factor=3.0)
    model = rope_model(sliding_window=4, window_layers=(0,), rope_local_base=50.0,
                       rope_local_scaling=local)  # fmt: skip
    with_rope_scaling(model, LINEAR2)
    windowed, full = model.attention_modules()
    assert windowed.rotary.scaling == local and windowed.rotary.base == 50.0
    assert full.rotary.scaling == LINEAR2 and full.rotary.base == 100.0


def test_a_model_without_rotary_is_refused_in_one_line():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=8, n_layer=1, n_head=2, d_model=16, pe="alibi"))
    with pytest.raises(ProbeError, match="has alibi positions, not rotary") as info:
        with_rope_scaling(model, LINEAR2)
    assert "\n" not in str(info.value)


def test_a_request_fills_in_the_context_and_names_its_mistakes():
    request = RopeRequest.from_dict({"kind": "yarn", "factor": 4.0})
    assert request.filled() == ["original_max_position_embeddings"]
    assert request.complete(512).original_max_position_embeddings == 512
    given = RopeRequest.from_dict({"kind": "dynamic", "factor": 2, "max_position_embeddings": 9})
    assert given.complete(512).max_position_embeddings == 9 and given.filled() == []
    for table, said in (
        ({"kind": "lienar", "factor": 2}, "Did you mean 'linear'?"),
        ({"kind": "linear", "factr": 2}, "Did you mean 'factor'?"),
        ({"kind": "linear", "factor": 0}, "'factor' must be a finite number > 0"),
        ({"kind": "linear"}, "needs 'factor'"),
        ({"factor": 2}, "needs a kind"),
        ("linear", "must be a table"),
    ):
        with pytest.raises(ProbeError, match=re.escape(said)):
            RopeRequest.from_dict(table, "x.toml [model] rope_scaling")


def test_the_training_context_is_the_longest_training_example():
    cfg = ModelConfig(vocab_size=TASK.vocab_size, pe="rope", max_len=64)
    # copy: [BOS] n symbols [SEP] n answers
    assert training_context(cfg, TASK, TrainConfig(train_len=(2, 5)))[0] == 12
    randomized = TrainConfig(train_len=(2, 5), random_positions=True)
    assert training_context(cfg, TASK, randomized)[0] == 64
    assert training_context(cfg, None, None) == (64, "the model's max_position_embeddings")


# ------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """A rotary checkpoint, the same weights saved with linear factor 2 in their config, and a
    learned-position checkpoint."""
    root = tmp_path_factory.mktemp("rope")
    model = rope_model(max_len=64)
    train = TrainConfig(steps=1, train_len=(2, 5))
    save_checkpoint(root / "plain", model, TASK, train)
    scaled = Transformer(dataclasses.replace(model.cfg, rope_scaling=LINEAR2))
    scaled.load_state_dict(model.state_dict())
    save_checkpoint(root / "scaled", scaled, TASK, train)
    learned = Transformer(ModelConfig(vocab_size=TASK.vocab_size, n_layer=1, n_head=2,
                                      d_model=16, pe="learned"))  # fmt: skip
    save_checkpoint(root / "learned", learned, TASK, train)
    return {"plain": root / "plain", "scaled": root / "scaled", "learned": root / "learned",
            "model": model}  # fmt: skip


ROPE = ["--rope-scaling", "linear", "--rope-factor", "2"]


def expected_loss(model: Transformer, n: int, seed: int, factor: float) -> float:
    """The eval loss at task length n, computed here: the mean over examples of the answer
    tokens' cross-entropy, the model run at positions / factor."""
    total, count = 0.0, 0
    for batch in eval_batches(TASK, form_for("decoder"), [n], 16, 1, seed + n):
        seq = batch.inputs.shape[1]
        positions = (torch.arange(seq, dtype=torch.float32) / factor).expand(len(batch.inputs), -1)
        logits = logits_at(model, batch.inputs, positions)  # [batch, seq, vocab]
        ce = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), batch.targets, reduction="none"
        )  # [batch, seq]
        mask = batch.loss_mask.float()  # [batch, seq]
        total += ((ce * mask).sum(1) / mask.sum(1)).sum().item()
        count += len(batch.inputs)
    return total / count


def test_eval_with_linear_factor_2_is_the_model_at_half_the_positions(ckpts, tmp_path):
    model = ckpts["model"]
    args = ["eval", str(ckpts["plain"]), "--lengths", "5,9", "--batch-size", "16",
            "--batches", "1", "--seed", "3"]  # fmt: skip
    assert exit_code([*args, "--out", str(tmp_path / "plain")]) == 0
    assert exit_code([*args, "--out", str(tmp_path / "scaled"), *ROPE]) == 0
    for name, factor in (("plain", 1.0), ("scaled", 2.0)):
        table = pd.read_csv(tmp_path / name / "eval.csv")
        for n in (5, 9):
            got = table[(table.length == n) & (table.metric == "loss")].value.item()
            assert got == pytest.approx(expected_loss(model, n, 3, factor), abs=1e-5), (name, n)
    plain = pd.read_csv(tmp_path / "plain" / "eval.csv").value
    assert (plain - pd.read_csv(tmp_path / "scaled" / "eval.csv").value).abs().max() > 1e-3
    manifest = json.loads((tmp_path / "scaled" / "manifest.json").read_text())
    assert manifest["rope_scaling"] == {"kind": "linear", "factor": 2.0}
    assert manifest["model"]["rope_scaling"] == {"kind": "default"}  # the checkpoint's own
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["rope_scaling"] is None


@pytest.mark.slow  # three inspections with their plots: about 6 s
def test_inspect_with_the_option_is_inspect_of_the_model_saved_with_it(ckpts, tmp_path):
    args = ["--lengths", "8", "--batch-size", "8", "--batches", "1", "--needles", "0"]
    assert exit_code(["inspect", str(ckpts["plain"]), "--out", str(tmp_path / "a"), *args,
                      *ROPE]) == 0  # fmt: skip
    assert exit_code(["inspect", str(ckpts["scaled"]), "--out", str(tmp_path / "b"), *args]) == 0
    assert exit_code(["inspect", str(ckpts["plain"]), "--out", str(tmp_path / "c"), *args]) == 0
    a, b, c = (pd.read_csv(tmp_path / x / "attention_stats.csv") for x in "abc")
    pd.testing.assert_frame_equal(a, b)
    assert (a.value - c.value).abs().max() > 1e-3
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["rope_scaling"] == {"kind": "linear", "factor": 2.0}


def test_generate_with_the_option_continues_as_the_model_at_half_the_positions(ckpts):
    model, prompt = ckpts["model"], [1, 2, 3, 4, 2, 5]
    tokens = list(prompt)
    for _ in range(6):  # greedy, one full forward a token, positions / 2
        positions = (torch.arange(len(tokens), dtype=torch.float32) / 2).unsqueeze(0)
        logits = logits_at(model, torch.tensor([tokens]), positions)  # [1, seq, vocab]
        tokens.append(int(logits[0, -1].argmax()))
    result = CliRunner().invoke(app, ["generate", str(ckpts["plain"]), "--tokens",
                                      ",".join(map(str, prompt)), "--max-new-tokens", "6",
                                      "--check", *ROPE])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "rotary scaling linear" in lines[0]
    assert lines[1] == ",".join(map(str, tokens[len(prompt) :]))


def test_view_with_the_option_is_view_of_the_model_saved_with_it(ckpts, tmp_path):
    def data(target, out, *extra):
        assert exit_code(["view", str(target), "--out", str(out), "--length", "6",
                          "--importance", "none", *extra]) == 0  # fmt: skip
        html = out.read_text()
        found = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>',
                          html, re.S)  # fmt: skip
        return json.loads(found.group(1))

    a = data(ckpts["plain"], tmp_path / "a.html", *ROPE)
    b = data(ckpts["scaled"], tmp_path / "b.html")
    c = data(ckpts["plain"], tmp_path / "c.html")
    assert a["statistics"] == b["statistics"] and a["examples"] == b["examples"]
    assert a["statistics"] != c["statistics"]
    assert a["provenance"]["rope_scaling"] == {"kind": "linear", "factor": 2.0}
    assert c["provenance"]["rope_scaling"] is None


@pytest.mark.parametrize("extra, said", [
    (["--rope-scaling", "lienar", "--rope-factor", "2"], "Did you mean 'linear'?"),
    (["--rope-scaling", "linear", "--rope-factor", "0"], "--rope-factor must be a finite"),
    (["--rope-scaling", "linear", "--rope-factor", "nan"], "--rope-factor must be a finite"),
    (["--rope-factor", "2"], "--rope-factor needs --rope-scaling"),
    (["--rope-scaling", "linear"], "--rope-scaling linear needs --rope-factor"),
    (["--rope-scaling", "ntk", "--rope-factor", "2"], "needs --rope-alpha"),
    (["--rope-scaling", "linear", "--rope-factor", "2", "--rope-original", "8"], "anchors at no"),
    (["--rope-scaling", "longrope"], "per-pair factor tables"),
])  # fmt: skip
def test_bad_rope_options_are_one_line_exit_2(ckpts, tmp_path, capsys, extra, said):
    for command in (["eval", str(ckpts["plain"]), "--out", str(tmp_path / "o")],
                    ["generate", str(ckpts["plain"]), "--tokens", "1,2"]):  # fmt: skip
        capsys.readouterr()
        assert exit_code([*command, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    assert not (tmp_path / "o").exists()


def test_a_learned_position_checkpoint_is_refused(ckpts, tmp_path, capsys):
    assert exit_code(["inspect", str(ckpts["learned"]), "--out", str(tmp_path / "o"), *ROPE]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "learned positions, not rotary" in err


def test_a_longrope_table_without_a_factor_takes_it_from_the_models_context():
    """The documented path for longrope (a study's table: per-pair tables and the original
    context): its factor is the model's context over the original, as transformers takes it."""
    from probe.rope_experiment import RopeRequest

    table = {"kind": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
             "original_max_position_embeddings": 64}  # fmt: skip
    scaling = RopeRequest.from_dict(table).complete(256)
    assert scaling.resolved_factor() == 4.0


def test_a_hugging_face_spelling_of_the_kind_is_told_its_name_here():
    from probe.rope_experiment import RopeRequest

    with pytest.raises(ProbeError, match="'rope_type' is 'kind' here"):
        RopeRequest.from_dict({"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ProbeError, match="Did you mean 'linear'"):
        RopeRequest.from_dict({"kind": "LINEAR", "factor": 2.0})
