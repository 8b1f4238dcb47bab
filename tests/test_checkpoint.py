"""Checkpoints: identical logits after a round trip, and one clear error for each bad kind."""

import json

import pytest
import torch

from probe import load_checkpoint
from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.model import Transformer
from probe.train_config import TrainConfig


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="encoder-decoder", pe="t5", scale="learned", n_head=2, d_model=16)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.attention_modules()[0].gate[1] = 0.0
    path = save_checkpoint(tmp_path / "ckpt", model, TaskConfig(), TrainConfig(), {"seed": 3})
    return path, model


def test_save_then_load_gives_identical_logits(saved):
    path, model = saved
    ckpt = load_checkpoint(path)
    tokens, source = torch.randint(0, 32, (2, 6)), torch.randint(0, 32, (2, 4))
    assert torch.equal(ckpt.model(tokens, source), model(tokens, source))
    assert ckpt.model_cfg == model.cfg
    assert ckpt.meta["seed"] == 3
    assert ckpt.model.head.weight is ckpt.model.embed.weight  # tying survives


def test_missing_path(tmp_path):
    with pytest.raises(ProbeError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_missing_weights(saved):
    path, _ = saved
    (path / "model.safetensors").unlink()
    with pytest.raises(ProbeError, match=r"model\.safetensors is missing"):
        load_checkpoint(path)


def test_truncated_weights(saved):
    path, _ = saved
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ProbeError, match="truncated or corrupt"):
        load_checkpoint(path)


def test_garbage_weights(saved):
    path, _ = saved
    (path / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ProbeError, match="truncated or corrupt"):
        load_checkpoint(path)


def test_corrupt_config(saved):
    path, _ = saved
    (path / "config.json").write_text("{not json")
    with pytest.raises(ProbeError, match="not valid JSON"):
        load_checkpoint(path)


def test_config_that_does_not_match_the_weights(saved):
    path, _ = saved
    doc = json.loads((path / "config.json").read_text())
    doc["model"]["d_model"] = 32
    (path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ProbeError, match="shape"):
        load_checkpoint(path)


def test_config_with_unknown_field(saved):
    path, _ = saved
    doc = json.loads((path / "config.json").read_text())
    doc["model"]["n_heads"] = 2
    (path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ProbeError, match="n_heads"):
        load_checkpoint(path)


def test_pickle_is_refused_without_the_flag(saved):
    path, model = saved
    (path / "model.safetensors").unlink()
    torch.save(model.state_dict(), path / "model.pt")
    with pytest.raises(ProbeError, match="--allow-pickle"):
        load_checkpoint(path)
    ckpt = load_checkpoint(path, allow_pickle=True)
    tokens, source = torch.randint(0, 32, (1, 3)), torch.randint(0, 32, (1, 3))
    assert torch.equal(ckpt.model(tokens, source), model(tokens, source))


def test_a_plain_file_is_not_a_checkpoint(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ProbeError, match="is a file"):
        load_checkpoint(f)


def test_checking_an_output_never_removes_what_another_process_made_meanwhile(
    tmp_path, monkeypatch
):
    """claim_output makes the missing folders to prove they can be written, then removes them;
    a folder another process wrote into meanwhile (parallel study cells share models/) stays."""
    import tempfile

    from probe.files import claim_output

    real = tempfile.TemporaryFile

    def with_a_neighbour(*args, **kwargs):
        (tmp_path / "models" / ".other-run").mkdir()  # another cell's folder, made meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", with_a_neighbour)
    assert claim_output(tmp_path / "models" / ".mine", ("config.json",)) == []
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".other-run"]


@pytest.mark.parametrize("objective", ["x", None, 3])
def test_an_edited_objective_names_the_field_and_the_choices(tmp_path, objective):
    cfg = ModelConfig(arch="decoder", vocab_size=11, n_layer=1, n_head=2, d_model=16)
    path = save_checkpoint(tmp_path / "m", Transformer(cfg), None, None,
                           source={"format": "hf", "objective": "causal-lm"})  # fmt: skip
    load_checkpoint(path)  # the saved objective loads
    doc = json.loads((path / "config.json").read_text())
    doc["source"]["objective"] = objective
    (path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ProbeError, match=r"config.json: source.objective must be one of causal-lm"):
        load_checkpoint(path)
