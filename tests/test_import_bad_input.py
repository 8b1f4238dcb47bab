"""`probe import` of a bad Hugging Face directory: exit code 2 and one line naming the file, the
field and what was expected, never a raw exception. Each case is a valid tiny checkpoint saved
by transformers, with one mutation of its config.json or its files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_run import exit_code
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

DELETE = object()


def tiny(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=24, tie_word_embeddings=False)  # fmt: skip
        return transformers.LlamaForCausalLM(cfg)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=24)  # fmt: skip
        return transformers.Qwen2ForCausalLM(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=4, n_positions=20)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=24,
                                  max_position_embeddings=20)  # fmt: skip
    return transformers.BertModel(cfg, add_pooling_layer=False)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    for kind in ("llama", "qwen2", "gpt2", "bert"):
        tiny(kind).save_pretrained(root / kind)
    return {p.name: p for p in root.iterdir()}


def variant(base: Path, where: Path, **changes) -> Path:
    """A copy of `base` with config.json changed (DELETE removes a key)."""
    shutil.copytree(base, where)
    doc = json.loads((where / "config.json").read_text())
    for key, value in changes.items():
        if value is DELETE:
            doc.pop(key, None)
        else:
            doc[key] = value
    (where / "config.json").write_text(json.dumps(doc))
    return where


def run(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = exit_code(args)
    captured = capsys.readouterr()
    return code, captured.err


def refused(source: Path, out: Path, capsys, *extra: str) -> str:
    """The one error line of `probe import SOURCE --out OUT`; asserts exit 2 and no traceback."""
    code, err = run(["import", str(source), "--out", str(out), *extra], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err and "(run with --debug" not in err
    assert not (out / "config.json").exists()
    return " ".join(err.split())


# (family, config changes, words the message must hold)
CASES = [
    ("llama", {"num_attention_heads": "4"}, "config.json: num_attention_heads must be a positive "
     "integer, got '4' (str)"),
    ("llama", {"num_attention_heads": 4.5}, "num_attention_heads must be a positive integer, got "
     "4.5 (float)"),
    ("llama", {"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ("llama", {"num_attention_heads": [4]}, "num_attention_heads must be a positive integer, got "
     "[4] (list)"),
    ("llama", {"num_attention_heads": True}, "got True (bool)"),
    ("llama", {"hidden_size": {"x": 16}}, "hidden_size must be a positive integer, got {'x': 16}"),
    ("llama", {"hidden_size": DELETE}, "has no 'hidden_size'"),
    ("llama", {"num_hidden_layers": -1}, "num_hidden_layers must be a positive integer"),
    ("llama", {"intermediate_size": "24"}, "intermediate_size must be a positive integer"),
    ("llama", {"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer"),
    ("llama", {"num_key_value_heads": 3}, "num_attention_heads (4) must be a multiple of "
     "num_key_value_heads (3)"),
    ("llama", {"head_dim": 0}, "head_dim must be a positive integer"),
    ("llama", {"max_position_embeddings": "2048"}, "max_position_embeddings must be a positive "
     "integer"),
    ("llama", {"vocab_size": 10**12}, "of memory"),
    ("llama", {"rms_norm_eps": "small"}, "rms_norm_eps must be a positive number, got 'small'"),
    ("llama", {"rms_norm_eps": 0}, "rms_norm_eps must be a positive number, got 0"),
    ("llama", {"rope_theta": "abc"}, "rope_theta must be a positive number, got 'abc' (str)"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": [1e4]}},
     "rope_parameters.rope_theta must be a positive number"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1.0}},
     "rope_theta must be a number greater than 1"),
    ("llama", {"rope_parameters": [1, 2]}, "rope_parameters must be a mapping or null, got [1, 2]"),
    ("llama", {"rope_scaling": [1, 2]}, "rope_scaling must be a mapping or null, got [1, 2]"),
    ("llama", {"rope_scaling": {"type": "linear"}},
     "rope_scaling: rotary scaling kind 'linear' needs 'factor'; it is missing."),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
     "rope_parameters: rotary scaling kind 'llama3' needs 'low_freq_factor'"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": float("nan")}},
     "rotary scaling 'factor' must be a finite number > 0, got nan"),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "short_factor": [1, 2],
                                   "long_factor": [1]}}, "'long_factor' has 1 entries"),
    ("llama", {"rope_parameters": {"rope_type": "ntk", "alpha": 2.0}}, "kind 'ntk' is probe's "
     "own: transformers has none"),
    ("llama", {"rope_parameters": {"rope_type": 3}}, "rope_parameters.rope_type must be a string"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5: rotary embedding on "
     "part of each head is not implemented"),
    ("llama", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor = 0.5"),
    ("llama", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping = 50.0: soft-capped "
     "attention logits is not implemented"),
    ("llama", {"final_logit_softcapping": 30.0}, "soft-capped output logits"),
    ("llama", {"use_qk_norm": True}, "norms on queries and keys"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act = 'gelu': probe implements silu"),
    ("llama", {"hidden_act": ["silu"]}, "hidden_act must be a string, got ['silu'] (list)"),
    ("llama", {"mlp_bias": True}, "mlp_bias = True: biases in the MLP are not implemented"),
    ("llama", {"mlp_bias": "no"}, "mlp_bias must be true or false, got 'no'"),
    ("llama", {"attention_bias": 1}, "attention_bias must be true or false, got 1 (int)"),
    ("llama", {"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
    ("llama", {"model_type": DELETE}, "config.json has no model_type"),
    ("llama", {"model_type": ["llama"]}, "model_type ['llama'] is not supported"),
    ("qwen2", {"num_key_value_heads": "2"}, "num_key_value_heads must be a positive integer"),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 0}},
     "rope_scaling: rotary scaling 'factor' must be a finite number > 0, got 0"),
    ("gpt2", {"n_embd": "16"}, "n_embd must be a positive integer, got '16' (str)"),
    ("gpt2", {"n_head": 0}, "n_head must be a positive integer, got 0"),
    ("gpt2", {"n_head": 5}, "n_embd (16) must be a multiple of n_head (5)"),
    ("gpt2", {"n_inner": 12.5}, "n_inner must be a positive integer, got 12.5"),
    ("gpt2", {"n_positions": None, "n_ctx": 20}, "has no 'n_positions'"),
    ("gpt2", {"activation_function": "swish"}, "activation_function = 'swish': probe implements "
     "gelu, gelu_new, gelu_fast, gelu_pytorch_tanh, relu"),
    ("gpt2", {"layer_norm_epsilon": [1e-5]}, "layer_norm_epsilon must be a positive number"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx = True"),
    ("gpt2", {"scale_attn_weights": "yes"}, "scale_attn_weights must be true or false"),
    ("gpt2", {"add_cross_attention": True}, "cross-attention layers is not implemented"),
    ("bert", {"is_decoder": True}, "is_decoder = True: an encoder run as a causal decoder"),
    ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type = "
     "'relative_key': probe implements absolute"),
    ("bert", {"type_vocab_size": -1}, "type_vocab_size must be an integer of at least 0"),
    ("bert", {"hidden_act": {"fn": "gelu"}}, "hidden_act must be a string"),
    ("bert", {"num_attention_heads": 3}, "hidden_size (16) must be a multiple of "
     "num_attention_heads (3)"),
    ("bert", {"layer_norm_eps": -1e-12}, "layer_norm_eps must be a positive number"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{next(iter(c[1]))}" for c in CASES])
def test_bad_config_is_one_line(case, bases, tmp_path, capsys):
    kind, changes, words = case
    source = variant(bases[kind], tmp_path / "src", **changes)
    message = refused(source, tmp_path / "out", capsys)
    assert words in message, message
    if "must be" in words:
        assert str(source / "config.json") in message  # the file is named


def test_the_unmutated_bases_import(bases, tmp_path, capsys):
    for kind, path in bases.items():
        code, err = run(["import", str(path), "--out", str(tmp_path / kind)], capsys)
        assert code == 0, err


def test_huge_vocabulary_is_refused_with_the_bytes_it_needs(bases, tmp_path, capsys):
    source = variant(bases["llama"], tmp_path / "src", vocab_size=10**12)
    message = refused(source, tmp_path / "out", capsys)
    assert "32,000,000,0" in message and "iB of memory" in message, message


def edit_weights(path: Path, change) -> Path:
    state = load_file(str(path / "model.safetensors"))
    save_file(change(dict(state)), str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool])
def test_integer_and_bool_weights_are_refused_naming_the_tensor(dtype, bases, tmp_path, capsys):
    name = "model.layers.0.mlp.up_proj.weight"
    source = edit_weights(variant(bases["llama"], tmp_path / "src"),
                          lambda s: {**s, name: s[name].to(dtype)})  # fmt: skip
    message = refused(source, tmp_path / "out", capsys)
    assert f"tensor '{name}' holds {str(dtype)[6:]} values" in message, message


def test_nonfinite_weights_are_refused_unless_allowed(bases, tmp_path, capsys):
    name = "model.embed_tokens.weight"

    def poison(state):
        bad = state[name].clone()
        bad[0, 0], bad[1, 1] = float("nan"), float("inf")
        return {**state, name: bad}

    source = edit_weights(variant(bases["llama"], tmp_path / "src"), poison)
    message = refused(source, tmp_path / "out", capsys)
    assert f"tensor '{name}' holds 2 NaN or infinite values" in message, message
    assert "--allow-nonfinite" in message
    code, err = run(["import", str(source), "--out", str(tmp_path / "ok"), "--allow-nonfinite"],
                    capsys)  # fmt: skip
    assert code == 0, err


def test_a_tensor_probe_has_no_place_for_is_refused(bases, tmp_path, capsys):
    extra = "model.layers.0.mlp.up_proj.bias"
    source = edit_weights(variant(bases["llama"], tmp_path / "src"),
                          lambda s: {**s, extra: torch.ones(24)})  # fmt: skip
    message = refused(source, tmp_path / "out", capsys)
    assert f"has no place for ({extra})" in message, message


def test_a_nonzero_o_proj_bias_is_refused_and_a_zero_one_imported(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                   num_attention_heads=4, intermediate_size=24,
                                   attention_bias=True)  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.bias.add_(0.1)  # transformers starts it at zero
    model.save_pretrained(tmp_path / "biased")
    message = refused(tmp_path / "biased", tmp_path / "out", capsys)
    assert "non-zero bias on o_proj" in message, message
    bias = "model.layers.0.self_attn.o_proj.bias"
    edit_weights(tmp_path / "biased", lambda s: {**s, bias: torch.zeros_like(s[bias])})
    code, err = run(["import", str(tmp_path / "biased"), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err


def test_tokenizer_larger_than_the_vocabulary_is_refused(bases, tmp_path, capsys):
    from tokenizers import Tokenizer, models

    source = variant(bases["llama"], tmp_path / "src")
    vocab = {f"t{i}": i for i in range(50)}  # the model has 40 embeddings
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(source / "tokenizer.json"))
    message = refused(source, tmp_path / "out", capsys)
    assert "50 tokens" in message and "vocabulary holds 40" in message, message


def index(source: Path, weight_map) -> Path:
    weights = source / "model.safetensors"
    weights.rename(source / "model-00001-of-00001.safetensors")
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return source


@pytest.mark.parametrize(
    "weight_map, words",
    [
        ({}, "weight_map must be a non-empty mapping"),
        ([["a", "b"]], "weight_map must be a non-empty mapping"),
        (None, "weight_map must be a non-empty mapping"),
        ({"x": "model-00002-of-00002.safetensors"}, "1 of them are missing"),
        ({"x": "../model.safetensors"}, "must be the name of a shard file"),
        ({"x": 3}, "must be the name of a shard file"),
    ],
)
def test_bad_shard_index_is_one_line(weight_map, words, bases, tmp_path, capsys):
    source = index(variant(bases["gpt2"], tmp_path / "src"), weight_map)
    assert words in refused(source, tmp_path / "out", capsys)


def test_weights_that_are_a_directory_are_named_so(bases, tmp_path, capsys):
    source = variant(bases["gpt2"], tmp_path / "src")
    (source / "model.safetensors").unlink()
    (source / "model.safetensors").mkdir()
    assert "model.safetensors is a directory" in refused(source, tmp_path / "out", capsys)
    sharded = index(variant(bases["gpt2"], tmp_path / "sharded"), {"x": "shard.safetensors"})
    (sharded / "shard.safetensors").mkdir()
    assert "shard.safetensors is a directory" in refused(sharded, tmp_path / "out", capsys)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("file", ["config.json", "model.safetensors.index.json", "tokenizer.json"])
def test_deeply_nested_json_is_one_line(file, bases, tmp_path, capsys):
    source = variant(bases["gpt2"], tmp_path / "src")
    if file == "model.safetensors.index.json":
        index(source, {})
    (source / file).write_text(DEEP)
    message = refused(source, tmp_path / "out", capsys)
    assert file in message, message


def test_an_interrupted_import_writes_nothing_and_the_rerun_works(bases, tmp_path, capsys,
                                                                 monkeypatch):  # fmt: skip
    import probe.checkpoint as cli  # `probe import` takes save_checkpoint from there when it runs
    from probe.errors import Interrupted

    real_save = cli.save_checkpoint

    def save_then_interrupt(path, *args, **kwargs):
        real_save(path, *args, **kwargs)  # every file written into the staging folder
        raise Interrupted()  # Ctrl-C before they are moved into --out

    out = tmp_path / "out"
    monkeypatch.setattr(cli, "save_checkpoint", save_then_interrupt)
    code, err = run(["import", str(bases["gpt2"]), "--out", str(out)], capsys)
    assert code == 130 and "nothing was written" in err and "run the same command again" in err
    assert not out.exists()  # it made --out, and took it away again
    monkeypatch.setattr(cli, "save_checkpoint", real_save)
    code, err = run(["import", str(bases["gpt2"]), "--out", str(out)], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_a_later_import_removes_only_the_staging_folders_of_dead_runs(bases, tmp_path, capsys):
    import fcntl
    import os

    out = tmp_path / "out"
    dead, live = out / ".probe-stage-dead.probe-tmp", out / ".probe-stage-live.probe-tmp"
    for folder in (dead, live):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half")
    (out / ".notes.probe-tmp").write_text("mine")
    (out / "notes.txt").write_text("mine")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a run still writing holds it
    try:
        code, err = run(["import", str(bases["gpt2"]), "--out", str(out)], capsys)
    finally:
        os.close(fd)
    assert code == 0, err
    assert not dead.exists() and (live / "model.safetensors").read_bytes() == b"half"
    assert (out / ".notes.probe-tmp").read_text() == "mine" == (out / "notes.txt").read_text()
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_checkpoint_weights_that_are_a_directory_are_named_so(bases, tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert run(["import", str(bases["gpt2"]), "--out", str(out)], capsys)[0] == 0
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").mkdir()
    code, err = run(["info", str(out)], capsys)
    assert code == 2 and "model.safetensors is a directory" in err, err


def test_an_untied_config_without_an_output_layer_is_refused(bases, tmp_path, capsys):
    """transformers would start a random lm_head; probe refuses rather than tie it silently."""

    def drop_head(state):
        return {k: v for k, v in state.items() if k != "lm_head.weight"}

    source = edit_weights(variant(bases["llama"], tmp_path / "src"), drop_head)  # untied config
    message = refused(source, tmp_path / "out", capsys)
    assert "tie_word_embeddings = False" in message and "no lm_head.weight" in message, message
    tied = edit_weights(variant(bases["llama"], tmp_path / "tied", tie_word_embeddings=True),
                        drop_head)  # fmt: skip
    code, err = run(["import", str(tied), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
