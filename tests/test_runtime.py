"""The runtime: device and dtype resolved once, checkpoints kept in their dtype, manifests that
record what ran, and a model built for loading that holds no second copy of the weights."""

import json
import re

import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.model import Transformer
from probe.runtime import Runtime, dtype_name, resolve_dtype
from probe.train_config import TrainConfig

HALF = [torch.bfloat16, torch.float16]


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(arch="decoder", pe="rope", vocab_size=40, d_model=32, n_head=4, n_layer=2,
                       **kw)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("float32", torch.float32), ("bf16", torch.bfloat16), ("FP16", torch.float16),
     ("torch.bfloat16", torch.bfloat16), (None, None), (torch.float16, torch.float16)],
)  # fmt: skip
def test_dtype_names_resolve(name, dtype):
    assert resolve_dtype(name) is dtype


@pytest.mark.parametrize("name", ["int8", "float64", "", "bfloat"])
def test_unknown_dtypes_are_one_line(name):
    with pytest.raises(ProbeError, match="float32, bfloat16 or float16"):
        resolve_dtype(name)


def test_runtime_resolves_auto_and_records_the_model():
    runtime = Runtime.resolve("auto", "bf16")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert runtime.device.type == expected and runtime.dtype is torch.bfloat16
    assert runtime.autocast == (expected == "cuda")
    model = Transformer(_cfg()).to(torch.float16)
    record = Runtime.resolve("cpu").record(model)  # the model's own dtype wins over the asked
    assert record["device"] == "cpu" and record["dtype"] == "float16"
    assert record["threads"] == torch.get_num_threads()
    with pytest.raises(ProbeError, match="threads must be at least 1"):
        Runtime.resolve("cpu", threads=0)


@pytest.mark.parametrize("tie", [True, False])
def test_an_empty_model_filled_with_weights_computes_the_same(tie):
    torch.manual_seed(0)
    model = Transformer(_cfg(tie_embeddings=tie)).eval()
    empty = Transformer.empty(model.cfg)
    empty.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 40, (2, 9))
    assert torch.equal(empty(tokens), model(tokens))
    assert (empty.head.weight is empty.embed.weight) == tie
    assert all(g.eq(1).all() for g in empty.gates())


@pytest.mark.parametrize("dtype", HALF)
def test_rotary_frequencies_stay_float32_in_half_precision(dtype):
    cfg = _cfg()
    for model in (Transformer(cfg).to(dtype), Transformer.empty(cfg, dtype)):
        rotary = model.blocks[0].attn.rotary
        half = cfg.rotary_dims // 2
        exact = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) / half)  # the formula
        assert rotary.inv_freq.dtype == torch.float32
        torch.testing.assert_close(rotary.inv_freq.double(), exact, rtol=1e-6, atol=0)
        assert model.embed.weight.dtype == dtype


def _saved(tmp_path, dtype: torch.dtype):
    torch.manual_seed(1)
    model = Transformer(_cfg()).eval().to(dtype)
    path = save_checkpoint(tmp_path / dtype_name(dtype), model, TaskConfig(), TrainConfig())
    return path, model


@pytest.mark.parametrize("dtype", HALF)
def test_a_checkpoint_loads_in_the_dtype_it_was_saved_in(tmp_path, dtype):
    path, model = _saved(tmp_path, dtype)
    assert json.loads((path / "config.json").read_text())["dtype"] == dtype_name(dtype)
    ckpt = load_checkpoint(path)
    loaded = dict(ckpt.model.named_parameters())
    for name, p in model.named_parameters():
        assert loaded[name].dtype == dtype and torch.equal(loaded[name], p), name
    up = load_checkpoint(path, dtype="float32")  # exact: every half value is a float32 value
    for name, p in model.named_parameters():
        assert torch.equal(dict(up.model.named_parameters())[name], p.float()), name


def test_a_checkpoint_without_a_dtype_record_is_float32(tmp_path):
    path, _ = _saved(tmp_path, torch.float32)
    document = json.loads((path / "config.json").read_text())
    del document["dtype"]  # as every checkpoint written before the record
    (path / "config.json").write_text(json.dumps(document))
    assert load_checkpoint(path).model.embed.weight.dtype == torch.float32
    document["dtype"] = "int4"
    (path / "config.json").write_text(json.dumps(document))
    with pytest.raises(ProbeError, match="records dtype 'int4'"):
        load_checkpoint(path)


def test_info_reads_no_weight(tmp_path, capsys):
    path, _ = _saved(tmp_path, torch.bfloat16)
    ckpt = load_checkpoint(path, read_weights=False)
    assert ckpt.model.embed.weight.device.type == "meta"
    assert exit_code(["info", str(path)]) == 0
    assert "bfloat16" in capsys.readouterr().out


def test_the_manifest_records_the_dtype_that_ran(tmp_path):
    path, _ = _saved(tmp_path, torch.bfloat16)
    out = tmp_path / "eval"
    args = ["eval", str(path), "--lengths", "2:3", "--batch-size", "4", "--batches", "1"]
    assert exit_code([*args, "--out", str(out)]) == 0
    runtime = json.loads((out / "manifest.json").read_text())["runtime"]
    assert runtime["dtype"] == "bfloat16" and runtime["device"] == "cpu"
    assert exit_code([*args, "--dtype", "float32", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["runtime"]["dtype"] == "float32"


def test_bad_dtype_and_dtype_on_a_grid_study_are_one_line(tmp_path, capsys):
    path, _ = _saved(tmp_path, torch.float32)
    assert exit_code(["eval", str(path), "--dtype", "int8", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "Unknown dtype 'int8'" in err and len(err.strip().splitlines()) == 1
    code = exit_code(["study", "run", "studies/quickstart.toml", "--dtype", "bf16", "--smoke",
                      "--out", str(tmp_path / "s")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "grid study trains its models in float32" in " ".join(err.split())


def test_the_viewer_page_records_the_dtype_that_ran(tmp_path):
    path, _ = _saved(tmp_path, torch.bfloat16)
    page = tmp_path / "view.html"
    assert exit_code(["view", str(path), "--importance", "none", "--out", str(page)]) == 0
    found = re.search(r'<script[^>]*type="application/json"[^>]*>(.*?)</script>',
                      page.read_text(), re.S)  # fmt: skip
    runtime = json.loads(found.group(1))["provenance"]["runtime"]
    assert runtime["dtype"] == "bfloat16" and runtime["device"] == "cpu"
