"""The training loop: learning rate schedule, randomized positions, divergence safety, learning."""

import math

import pytest
import torch

import probe.training.train as train_module
from probe import load_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import Interrupted, ProbeError
from probe.train_config import TrainConfig
from probe.training.train import TrainingDiverged, lr_at, random_positions, train


def test_lr_schedule_warms_up_then_decays_by_cosine():
    cfg = TrainConfig(steps=110, lr=1.0, warmup=10, lr_min_ratio=0.1)
    assert lr_at(0, cfg, 64) == pytest.approx(0.1)
    assert lr_at(9, cfg, 64) == pytest.approx(1.0)
    mid = 10 + 50  # halfway through the decay
    assert lr_at(mid, cfg, 64) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_at(110, cfg, 64) == pytest.approx(0.1)


def test_random_positions_are_sorted_distinct_and_in_range():
    gen = torch.Generator().manual_seed(0)
    pos = random_positions(64, 10, 40, gen)
    assert pos.shape == (64, 10)
    assert (pos.diff(dim=1) > 0).all() and pos.min() >= 0 and pos.max() < 40
    assert len({tuple(p.tolist()) for p in pos}) > 50  # drawn per example
    with pytest.raises(ProbeError, match="max_len"):
        random_positions(1, 50, 40, gen)


def tiny(steps=20, **train):
    model = ModelConfig(vocab_size=13, n_head=2, d_model=16)
    return model, TaskConfig(n_symbols=8), TrainConfig(steps=steps, train_len=(2, 4), **train)


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    model_cfg, task, train_cfg = tiny(steps=30, eval_every=10)
    calls = {"n": 0}
    real_loss = train_module.batch_loss

    def loss_that_explodes(*args, **kwargs):
        calls["n"] += 1
        loss = real_loss(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 15 else loss

    monkeypatch.setattr(train_module, "batch_loss", loss_that_explodes)
    with pytest.raises(TrainingDiverged, match=r"step 15.*last good checkpoint"):
        train(model_cfg, task, train_cfg, tmp_path / "run")
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt.meta["steps_done"] == 10
    assert all(torch.isfinite(p).all() for p in ckpt.model.parameters())


def test_an_existing_checkpoint_is_not_overwritten_by_accident(tmp_path):
    model_cfg, task, train_cfg = tiny(steps=2)
    train(model_cfg, task, train_cfg, tmp_path / "run")
    with pytest.raises(ProbeError, match="--overwrite"):
        train(model_cfg, task, train_cfg, tmp_path / "run")
    train(model_cfg, task, train_cfg, tmp_path / "run", overwrite=True)


def test_overwrite_then_interrupt_never_mixes_two_runs(tmp_path):
    model_cfg, task, train_cfg = tiny(steps=30)
    train(model_cfg, task, train_cfg, tmp_path / "run")
    old_metrics = (tmp_path / "run" / "metrics.csv").read_text()

    def stop(progress) -> None:
        raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="no checkpoint was written"):
        train(model_cfg, task, train_cfg, tmp_path / "run", progress=stop, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.csv"]
    assert (tmp_path / "run" / "metrics.csv").read_text() != old_metrics  # the new run's


def test_a_checkpoint_with_a_nan_evaluation_is_not_good(tmp_path, monkeypatch):
    model_cfg, task, train_cfg = tiny(steps=20)
    real = train_module.evaluate

    def nan_loss_after_step_10(model, task, lengths, **kw):
        table = real(model, task, lengths, **kw)
        if kw["seed"] > 10_010:
            table.loc[table.metric == "loss", "value"] = float("nan")
        return table

    monkeypatch.setattr(train_module, "evaluate", nan_loss_after_step_10)
    cfg = TrainConfig(**{**train_cfg.to_dict(), "eval_every": 10})
    with pytest.raises(TrainingDiverged, match=r"step 20 .*last good checkpoint .*\(step 10\)"):
        train(model_cfg, task, cfg, tmp_path / "run")
    assert load_checkpoint(tmp_path / "run").meta["steps_done"] == 10


def test_same_seed_same_model():
    a = train(*tiny(steps=5)).model
    b = train(*tiny(steps=5)).model
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("arch", ["encoder", "encoder-decoder"])
def test_other_architectures_train(arch):
    model_cfg = ModelConfig(arch=arch, vocab_size=13, n_head=2, d_model=16, pe="t5")
    result = train(model_cfg, TaskConfig(n_symbols=8), TrainConfig(steps=3, train_len=(2, 4)))
    assert set(result.metrics.split) == {"train", "eval"}


@pytest.mark.slow
def test_a_small_decoder_learns_copy():
    """In-distribution exact match >= 0.99 on copy within a CI-sized budget (~1 min)."""
    model_cfg = ModelConfig(vocab_size=13, n_layer=2, n_head=2, d_model=64, pe="rope")
    task = TaskConfig(name="copy", n_symbols=8)
    cfg = TrainConfig(
        steps=1200, batch_size=64, lr=1e-3, train_len=(2, 6), eval_every=0, eval_batches=4
    )
    metrics = train(model_cfg, task, cfg).metrics
    final = metrics.query("split == 'eval' and metric == 'exact_match'")
    exact = (final.value * final.n).sum() / final.n.sum()
    assert exact >= 0.99, f"copy exact match {exact:.3f} < 0.99"


def test_attention_statistics_are_logged_per_head_during_training():
    model_cfg, task, train_cfg = tiny(steps=10, stats_every=5)
    metrics = train(model_cfg, task, train_cfg).metrics
    heads = metrics.query("split == 'attention' and metric == 'max_logit'")
    assert sorted(heads.step.unique()) == [5, 10]
    assert len(heads.groupby(["step", "layer", "head"])) == 2 * 2 * 2  # steps x layers x heads
    entropy = metrics.query("split == 'attention' and metric == 'entropy'").value
    assert (entropy > 0).all() and (entropy < torch.log(torch.tensor(20.0)).item()).all()
