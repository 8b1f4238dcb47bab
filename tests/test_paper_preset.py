"""The paper preset: the 2017 schedule, label smoothing, Adam settings and the preset itself, each
against the formula or an independent computation."""

import hashlib
import json

import pytest
import torch
from cli_run import exit_code

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig, make_batch
from probe.errors import ProbeError
from probe.measure.evaluate import batch_loss
from probe.model import Transformer
from probe.study.grid.cells import LATER_FIELDS, expand
from probe.study.grid.spec import parse_study
from probe.train_config import TrainConfig
from probe.training.presets import preset, with_preset
from probe.training.train import lr_at


def test_paper_schedule_is_section_5_3():
    cfg = TrainConfig(schedule="paper", lr=1.0, warmup=4000, steps=100_000)
    for step in (1, 10, 3999, 4000, 4001, 20_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert lr_at(step - 1, cfg, 512) == pytest.approx(expected, rel=1e-12)
    # the peak is at the end of warm-up: d^-0.5 * warmup^-0.5
    peak = max(lr_at(s, cfg, 512) for s in range(8000))
    assert peak == pytest.approx((512 * 4000) ** -0.5)
    doubled = TrainConfig(schedule="paper", lr=2.0, warmup=4000)
    assert lr_at(99, doubled, 512) == pytest.approx(2 * lr_at(99, cfg, 512))


def test_label_smoothing_mixes_the_target_with_uniform():
    torch.manual_seed(0)
    task = TaskConfig(name="copy", n_symbols=6)
    model = Transformer(ModelConfig(vocab_size=task.vocab_size, d_model=16, n_layer=1))
    batch = make_batch(task, "decoder", 4, 3, torch.Generator().manual_seed(1))
    eps = 0.1
    with torch.no_grad():
        logits = model(batch.inputs)  # [batch, seq, vocab]
        got = batch_loss(model, batch, logits=logits, label_smoothing=eps)
    logp = logits.log_softmax(-1)
    n_vocab = logits.shape[-1]
    total, count = 0.0, 0
    for b in range(logits.shape[0]):
        per = []
        for t in range(logits.shape[1]):
            if batch.loss_mask[b, t]:
                target = batch.targets[b, t]
                smooth = -(1 - eps) * logp[b, t, target] - eps / n_vocab * logp[b, t].sum()
                per.append(float(smooth))
        total += sum(per) / len(per)
        count += 1
    assert got.item() == pytest.approx(total / count, rel=1e-5)


def test_preset_lies_under_explicit_settings():
    merged = with_preset("paper", {"model": {"norm": "pre"}, "train": {"warmup": 10}})
    assert merged["model"]["norm"] == "pre" and merged["model"]["embed_scale"] is True
    assert merged["train"]["warmup"] == 10 and merged["train"]["schedule"] == "paper"
    model = ModelConfig(**preset("paper")["model"])
    train = TrainConfig(**preset("paper")["train"])
    assert (model.norm, model.pe, model.ffn, model.d_ff) == ("post", "sinusoidal", "relu", 256)
    assert (train.grad_clip, train.weight_decay, train.adam_eps) == (0.0, 0.0, 1e-9)
    with pytest.raises(ProbeError, match="Did you mean 'paper'"):
        preset("papr")


def test_train_with_the_paper_preset(tmp_path):
    out = tmp_path / "paper"
    args = ["train", "--preset", "paper", "--task", "copy", "--train-len", "2:4", "--steps", "6",
            "--d-model", "16", "--heads", "2", "--layers", "1", "--warmup", "3", "--scale",
            "inverse", "--eval-every", "0", "--out", str(out)]  # fmt: skip
    assert exit_code(args) == 0
    doc = json.loads((out / "config.json").read_text())
    assert doc["model"]["norm"] == "post" and doc["model"]["embed_scale"] is True
    assert doc["model"]["scale"] == "inverse"  # given on the command line: wins over the preset
    assert doc["train"]["warmup"] == 3 and doc["train"]["label_smoothing"] == 0.1
    lrs = [r for r in (out / "metrics.csv").read_text().splitlines() if ",lr," in r]
    first = float(lrs[0].rsplit(",", 2)[1])
    assert first == pytest.approx(16**-0.5 * min(1.0, 1 * 3**-1.5))
    assert exit_code(["train", "--preset", "papr", "--out", str(tmp_path / "x")]) == 2


def test_study_base_can_name_the_preset():
    study = parse_study({
        "study": {"name": "p", "question": "q?"},
        "base": {"preset": "paper", "model": {"n_layer": 1, "d_model": 16, "n_head": 2},
                 "train": {"steps": 2, "warmup": 1}},
        "grid": {"model.pe": ["sinusoidal", "rope"]},
    })  # fmt: skip
    cells = expand(study)
    assert [c.model.pe for c in cells] == ["sinusoidal", "rope"]
    assert all(c.model.norm == "post" and c.train.schedule == "paper" for c in cells)
    assert all(c.train.warmup == 1 for c in cells)
    with pytest.raises(ProbeError, match=r"\[base\] Unknown preset"):
        parse_study({"study": {"name": "p", "question": "q?"}, "base": {"preset": "nope"}})


def test_fields_added_later_keep_old_cell_keys_at_their_default():
    study = parse_study({
        "study": {"name": "p", "question": "q?"},
        "base": {"model": {"n_layer": 1, "d_model": 16, "n_head": 2}},
        "grid": {"train.schedule": ["cosine", "paper"]},
    })  # fmt: skip
    cosine, paper = expand(study)
    assert "schedule" not in cosine.train_dict()["train"]
    assert paper.train_dict()["train"]["schedule"] == "paper"
    assert cosine.key != paper.key
    # the key of a cell at the defaults is the digest of the configs as they were before the
    # later fields existed (so the committed cells of the shipped studies stay valid)
    later = ("device", *LATER_FIELDS["train"])
    train = {k: v for k, v in cosine.train.to_dict().items() if k not in later}
    new_model = LATER_FIELDS["model"]
    model = {("heads" if k == "kept_heads" else k): v
             for k, v in cosine.model.to_dict().items() if k not in new_model}  # fmt: skip
    old = {"model": model, "task": cosine.task.to_dict(), "train": train, "format": 1}
    text = json.dumps(old, sort_keys=True, separators=(",", ":"), default=str)
    assert cosine.train_key == hashlib.sha256(text.encode()).hexdigest()[:16]
