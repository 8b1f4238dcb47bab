"""Checkpoints larger than the shard limit are written as Hugging Face-style shards with an index,
load back bit for bit in their dtype, and a bad index is one line; every command that claims or
replaces a checkpoint's files knows the shards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from safetensors import safe_open

import probe.weights
from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.checkpoint_files import CHECKPOINT_FILES
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.files import claim_output, open_output
from probe.model import Transformer
from probe.train_config import TrainConfig

INDEX = "model.safetensors.index.json"
LIMIT = 6000  # bytes: the tiny model below takes several shards


def tiny(dtype: torch.dtype = torch.bfloat16) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_head=2, d_model=16)).to(dtype).eval()


def stored(model: Transformer) -> dict[str, torch.Tensor]:
    """What a checkpoint holds: the state dict without the head tied to the embedding."""
    state = model.state_dict()
    if model.cfg.tie_embeddings:
        state.pop("head.weight")
    return state


def save(path: Path, model: Transformer, shard_bytes: int | None = LIMIT) -> Path:
    return save_checkpoint(path, model, TaskConfig(), TrainConfig(), shard_bytes=shard_bytes)


def shards(path: Path) -> list[Path]:
    return sorted(path.glob("model-*-of-*.safetensors"))


def test_a_model_above_the_limit_is_sharded_and_loads_back_bit_for_bit(tmp_path):
    model = tiny()
    path = save(tmp_path / "ckpt", model)
    files = shards(path)
    assert len(files) > 1 and not (path / "model.safetensors").exists()
    assert [f.name for f in files] == [
        f"model-{k:05d}-of-{len(files):05d}.safetensors" for k in range(1, len(files) + 1)
    ]
    index = json.loads((path / INDEX).read_text())
    state = stored(model)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in state.values())
    assert set(index["weight_map"]) == set(state)
    for file in files:
        with safe_open(str(file), "pt") as f:
            names = list(f.keys())
            assert all(index["weight_map"][n] == file.name for n in names)
            size = sum(state[n].numel() * 2 for n in names)
            assert size <= LIMIT or len(names) == 1  # only a tensor larger than the limit alone
    ckpt = load_checkpoint(path)
    loaded = ckpt.model.state_dict()
    for name, tensor in model.state_dict().items():
        assert loaded[name].dtype == torch.bfloat16 and torch.equal(loaded[name], tensor), name
    assert ckpt.model.head.weight is ckpt.model.embed.weight


def test_saving_again_unsharded_leaves_no_shard_behind_and_back(tmp_path):
    model = tiny()
    path = save(tmp_path / "ckpt", model)
    save(path, model, shard_bytes=None)
    assert not shards(path) and not (path / INDEX).exists()
    assert (path / "model.safetensors").is_file()
    save(path, model)
    assert shards(path) and not (path / "model.safetensors").exists()
    assert torch.equal(load_checkpoint(path).model.embed.weight, model.embed.weight)


def bad_index(path: Path, how: str) -> None:
    index_file = path / INDEX
    index = json.loads(index_file.read_text())
    first = shards(path)[0]
    if how == "empty":
        index["weight_map"] = {}
    elif how == "missing shard":
        first.unlink()
    elif how == "lying":
        index["weight_map"]["blocks.0.attn.q.weight_typo"] = first.name
    elif how == "not json":
        index_file.write_text("{")
        return
    index_file.write_text(json.dumps(index))


@pytest.mark.parametrize(
    "how, words",
    [
        ("empty", "weight_map must be a non-empty mapping"),
        ("missing shard", "1 of them are missing"),
        ("lying", "holds the tensor 'blocks.0.attn.q.weight_typo', which no shard holds"),
        ("not json", "is not valid JSON"),
    ],
)
def test_a_bad_shard_index_is_one_line(how, words, tmp_path, capsys):
    path = save(tmp_path / "ckpt", tiny())
    bad_index(path, how)
    with pytest.raises(ProbeError, match=words):
        load_checkpoint(path)
    assert exit_code(["info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in " ".join(err.split()) and INDEX in err.replace("\n", ""), err


def test_claiming_an_output_finds_the_shards_and_open_output_removes_them(tmp_path):
    path = save(tmp_path / "ckpt", tiny())
    names = [f.name for f in shards(path)]
    listed = f"already holds {INDEX}, {', '.join(names[:3])} and {len(names) - 2} more"
    with pytest.raises(ProbeError, match=re.escape(listed)):  # (+ config.json: 4 shown)
        claim_output(path, CHECKPOINT_FILES)
    earlier = claim_output(path, CHECKPOINT_FILES, overwrite=True)
    assert set(earlier) == {*names, INDEX, "config.json"}
    open_output(path, earlier)
    assert not any(path.iterdir())


def hf_source(tmp_path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=48)  # fmt: skip
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "src")
    return tmp_path / "src"


def test_import_and_export_replace_sharded_outputs_whole(tmp_path, monkeypatch):
    source = hf_source(tmp_path)
    out, hf = tmp_path / "out", tmp_path / "hf"
    monkeypatch.setattr(probe.weights, "SHARD_BYTES", 20_000)
    assert exit_code(["import", str(source), "--out", str(out)]) == 0
    assert len(shards(out)) > 1
    assert exit_code(["import", str(source), "--out", str(out)]) == 2  # no --overwrite
    assert exit_code(["export", str(out), "--out", str(hf)]) == 0
    assert len(shards(hf)) > 1 and (hf / INDEX).is_file()
    monkeypatch.setattr(probe.weights, "SHARD_BYTES", 10**9)
    assert exit_code(["import", str(source), "--out", str(out), "--overwrite"]) == 0
    assert not shards(out) and not (out / INDEX).exists()
    assert exit_code(["info", str(out)]) == 0
    assert exit_code(["export", str(out), "--out", str(hf), "--overwrite"]) == 0
    assert not shards(hf) and not (hf / INDEX).exists() and (hf / "model.safetensors").is_file()
