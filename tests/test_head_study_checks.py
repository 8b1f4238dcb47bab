"""Bad head study files: every field is checked when the file is loaded (`probe study validate`,
and `probe study run` before it computes anything), and what needs the model is checked before
the first step runs. Each case is a mutation of one valid small study; each must end in exit
code 2 and one line naming the file, the section and the field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_run import exit_code

pytest.importorskip("transformers")

# section -> field -> TOML text: a valid study of a tiny Llama (source filled in per test)
VALID = {
    "study": {"name": '"tiny-checks"', "question": '"Which heads matter?"'},
    "model": {"source": "SOURCE"},
    "text": {"max_tokens": "16", "batch_size": "2", "batches": "1", "seeds": "1"},
    "importance": {"methods": '["random"]'},
    "curves": {"methods": '["random"]', "fractions": "[0.0, 0.5]"},
    "roles": {"enabled": "true", "period": "4", "needles": "1", "context": "64"},
    "knockout": {"heads": "[1]", "draws": "1", "prompts": "1"},
    "timing": {"fractions": "[0.5]", "batch_sizes": "[1]", "repeats": "1"},
    "operating": {"tolerance": "0.5"},
}


def render(sections: dict[str, dict[str, str]]) -> str:
    return "\n".join(
        f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items())
        for name, fields in sections.items()
    )


def mutated(source: Path | str, changes: dict[str, dict[str, str | None]]) -> str:
    sections = {name: dict(fields) for name, fields in VALID.items()}
    sections["model"]["source"] = json.dumps(str(source))
    for name, fields in changes.items():
        for key, value in fields.items():
            if value is None:
                sections.setdefault(name, {}).pop(key, None)
            else:
                sections.setdefault(name, {})[key] = value
    return render(sections)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("models")
    return {"llama": hf_dir("llama", root), "bert": hf_dir("bert", root)}


def refused(args: list[str], capsys) -> str:
    code = exit_code(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def make_sources(root: Path) -> dict[str, Path]:
    """Things that are not models, and text files that are not text."""
    (root / "empty").mkdir()
    (root / "no-weights").mkdir()
    (root / "no-weights" / "config.json").write_text('{"model_type": "llama"}')
    (root / "bart").mkdir()
    (root / "bart" / "config.json").write_text('{"model_type": "bart"}')
    (root / "ckpt").mkdir()
    (root / "ckpt" / "config.json").write_text(
        '{"format": "probe-checkpoint", "source": {"path": "/models/minilm"}}'
    )
    (root / "deep").mkdir()
    (root / "deep" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "notes.txt").write_text("hello")
    (root / "fake.gguf").write_bytes(b"NOPE" + bytes(16))
    (root / "binary.txt").write_bytes(b"text\x00\x01\x02")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "blank.txt").write_text("   \n\n")
    (root / "tiny.txt").write_text("A few words of text, not many.\n")
    return {p.name: p for p in root.iterdir()}


# (id, changes, words the message must hold): each a mutation of VALID
CASES = [
    ("source-missing", {"model": {"source": '"nowhere/model"'}}, ["[model] source", "nothing at"]),
    ("source-text-file", {"model": {"source": "@notes.txt"}}, ["[model] source", "not a .gguf"]),
    ("source-fake-gguf", {"model": {"source": "@fake.gguf"}}, ["not a GGUF file"]),
    ("source-empty-dir", {"model": {"source": "@empty"}}, ["without config.json"]),
    ("source-no-weights", {"model": {"source": "@no-weights"}}, ["no model.safetensors"]),
    ("source-family", {"model": {"source": "@bart"}}, ["[model] source", "'bart'", "llama"]),
    ("source-checkpoint", {"model": {"source": "@ckpt"}}, ["probe checkpoint", "/models/minilm"]),
    ("source-deep-json", {"model": {"source": "@deep"}}, ["config.json", "too deeply"]),
    ("source-bundled-typo", {"model": {"source": '"bundled:minilmm"'}}, ["Did you mean 'minilm'"]),
    ("source-bundled-bare", {"model": {"source": '"minilm"'}}, ["bundled:minilm"]),
    ("source-number", {"model": {"source": "3"}}, ["[model] needs a source"]),
    ("model-extra", {"model": {"weights": '"x"'}}, ["[model]", "unknown field 'weights'"]),
    ("text-missing", {"text": {"file": '"absent.txt"'}}, ["[text] file", "no file at"]),
    ("text-folder", {"text": {"file": '"."'}}, ["[text] file", "not a file"]),
    ("text-binary", {"text": {"file": "@binary.txt"}}, ["[text] file", "NUL bytes"]),
    ("text-latin1", {"text": {"file": "@latin1.txt"}}, ["[text] file", "not UTF-8", "0xe9"]),
    ("text-blank", {"text": {"file": "@blank.txt"}}, ["[text] file", "empty"]),
    ("text-too-little", {"text": {"file": "@tiny.txt"}}, ["[text]", "need more text"]),
    ("rows-absurd", {"text": {"batches": "1000000000"}}, ["[text]", "need more text"]),
    ("seeds-zero", {"text": {"seeds": "0"}}, ["[text] seeds", "at least 1"]),
    ("seeds-string", {"text": {"seeds": '"two"'}}, ["[text]", "'seeds'", "integer"]),
    ("seeds-float", {"text": {"seeds": "1.5"}}, ["[text]", "'seeds'", "integer"]),
    ("max-tokens-negative", {"text": {"max_tokens": "-5"}}, ["[text] max_tokens", "at least 2"]),
    ("batch-size-zero", {"text": {"batch_size": "0"}}, ["[text] batch_size", "at least 1"]),
    ("batches-zero", {"text": {"batches": "0"}}, ["[text] batches", "at least 1"]),
    ("whole-int", {"text": {"whole": "1"}}, ["[text]", "'whole'", "true or false"]),
    ("methods-string", {"importance": {"methods": '"random"'}}, ["[importance]", "a list"]),
    (
        "method-typo",
        {"curves": {"methods": '["gradiant"]'}},
        ["[curves] methods", "Did you mean 'gradient'", "Available:"],
    ),
    ("method-twice", {"importance": {"methods": '["random", "random"]'}}, ["twice"]),
    ("group-extra", {"curves": {"group_methods": '["fisher+tune"]'}}, ["not by key/value group"]),
    (
        "fractions-no-zero",
        {"curves": {"fractions": "[0.1, 0.5]"}},
        ["[curves] fractions", "start at 0.0"],
    ),
    ("fractions-only-zero", {"curves": {"fractions": "[0.0]"}}, ["at least one larger share"]),
    ("fractions-empty", {"curves": {"fractions": "[]"}}, ["[curves] fractions", "start at 0.0"]),
    ("fractions-unsorted", {"curves": {"fractions": "[0.0, 0.5, 0.25]"}}, ["must increase"]),
    ("fractions-repeated", {"curves": {"fractions": "[0.0, 0.5, 0.5]"}}, ["without repeats"]),
    ("fractions-above-1", {"curves": {"fractions": "[0.0, 1.5]"}}, ["[curves]", "[0, 1]"]),
    ("fractions-negative", {"curves": {"fractions": "[-0.1, 0.0]"}}, ["[curves]", "[0, 1]"]),
    ("fractions-nan", {"curves": {"fractions": "[0.0, nan]"}}, ["[curves]", "finite"]),
    ("timing-zero", {"timing": {"fractions": "[0.0]"}}, ["[timing] fractions", "strictly"]),
    ("timing-one", {"timing": {"fractions": "[1.0]"}}, ["[timing] fractions", "strictly"]),
    ("timing-unsorted", {"timing": {"fractions": "[0.5, 0.25]"}}, ["[timing]", "increase"]),
    ("repeats-zero", {"timing": {"repeats": "0"}}, ["[timing] repeats", "at least 1"]),
    ("threads-zero", {"timing": {"threads": "0"}}, ["[timing] threads", "CPU count"]),
    ("threads-absurd", {"timing": {"threads": "100000"}}, ["[timing] threads", "CPU count"]),
    ("batch-sizes-zero", {"timing": {"batch_sizes": "[0]"}}, ["[timing] batch_sizes"]),
    ("batch-sizes-twice", {"timing": {"batch_sizes": "[1, 1]"}}, ["[timing] batch_sizes", "twice"]),
    ("needles-negative", {"roles": {"needles": "-1"}}, ["[roles] needles", "at least 0"]),
    ("context-short", {"roles": {"context": "10"}}, ["[roles] context", "at least 64"]),
    ("period-zero", {"roles": {"period": "0"}}, ["[roles] period", "at least 2"]),
    ("enabled-string", {"roles": {"enabled": '"yes"'}}, ["[roles]", "'enabled'"]),
    ("knockout-no-needles", {"roles": {"needles": "0"}}, ["[knockout] heads", "[roles] needles"]),
    ("knockout-zero", {"knockout": {"heads": "[0]"}}, ["[knockout] heads", "at least 1"]),
    ("knockout-twice", {"knockout": {"heads": "[1, 1]"}}, ["[knockout] heads", "twice"]),
    ("draws-zero", {"knockout": {"draws": "0"}}, ["[knockout] draws", "at least 1"]),
    ("prompts-zero", {"knockout": {"prompts": "0"}}, ["[knockout] prompts", "at least 1"]),
    ("tolerance-negative", {"operating": {"tolerance": "-0.1"}}, ["[operating] tolerance"]),
    ("tolerance-inf", {"operating": {"tolerance": "inf"}}, ["[operating]", "finite"]),
    (
        "kv-method-typo",
        {"kv": {"methods": '["razr"]', "full_shares": "[0.5]", "lengths": "[128]"}},
        ["[kv] methods", "Did you mean 'razor'"],
    ),
    ("kv-no-lengths", {"kv": {"methods": '["razor"]', "full_shares": "[0.5]"}}, ["lengths"]),
    ("kv-no-shares", {"kv": {"methods": '["duo"]', "lengths": "[128]"}}, ["[kv]", "full_shares"]),
    ("kv-share-big", {"kv": {"full_shares": "[1.5]", "lengths": "[128]"}}, ["[kv] full_shares"]),
    ("kv-length-short", {"kv": {"lengths": "[10]"}}, ["[kv] lengths", "at least 64"]),
    ("kv-share-zero", {"kv": {"full_shares": "[0.0]", "lengths": "[128]"}}, ["[kv]", "above 0"]),
    ("kv-window-zero", {"kv": {"lengths": "[128]", "window": "0"}}, ["[kv] window", "at least 1"]),
    (
        "kv-method-twice",
        {"kv": {"methods": '["razor", "razor"]', "full_shares": "[0.5]", "lengths": "[128]"}},
        ["[kv] methods", "twice"],
    ),
    ("description-list", {"study": {"description": "[1]"}}, ["[study] description", "string"]),
    ("title-number", {"study": {"title": "3"}}, ["[study] title", "string"]),
    ("section-typo", {"timings": {"repeats": "1"}}, ["unknown field 'timings'", "'timing'"]),
    ("smoke-not-table", {"smoke": {"text": "3"}}, ["[smoke] text", "table"]),
    ("smoke-bad-value", {"smoke": {"text": "{ seeds = 0 }"}}, ["[smoke]", "seeds", "at least 1"]),
    ("smoke-unknown", {"smoke": {"txt": "{ seeds = 1 }"}}, ["[smoke]", "Did you mean 'text'"]),
]


@pytest.mark.parametrize(("changes", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_head_study_file_is_one_line_naming_its_field(models, tmp_path, capsys, changes,
                                                            words):  # fmt: skip
    things = make_sources(tmp_path)
    for fields in changes.values():  # "@name": one of the things made above
        for key, value in fields.items():
            if value and value.startswith("@"):
                fields[key] = json.dumps(str(things[value[1:]]))
    file = tmp_path / "bad.toml"
    file.write_text(mutated(models["llama"], changes))
    err = refused(["study", "validate", str(file)], capsys)
    assert str(file) in err
    for word in words:
        assert word in err, (word, err)


def test_the_valid_study_validates_and_run_checks_the_same(models, tmp_path, capsys):
    file = tmp_path / "ok.toml"
    file.write_text(mutated(models["llama"], {}))
    assert exit_code(["study", "validate", str(file)]) == 0, capsys.readouterr().err
    file.write_text(mutated(models["llama"], {"curves": {"fractions": "[0.1, 0.5]"}}))
    out = tmp_path / "out"
    err = refused(["study", "run", str(file), "--out", str(out)], capsys)
    assert "start at 0.0" in err and not out.exists()  # refused before anything was written
    file.write_text(mutated(models["llama"], {}))
    err = refused(["study", "run", str(file), "--out", str(out), "--threads", "100000"], capsys)
    assert "--threads" in err and "CPU count" in err


# what needs the model: checked once it is imported, before the first step is computed
NO_NEEDLES = {"roles": {"needles": "0"}, "knockout": {"heads": "[]"}}
MODEL_CASES = [
    (
        "max-tokens",
        "bert",
        {"text": {"max_tokens": "100"}, **NO_NEEDLES},
        ["[text] max_tokens = 100", "position table (64"],
    ),
    ("needles-encoder", "bert", {}, ["[roles] needles", "causal language model", "needles = 0"]),
    (
        "kv-encoder",
        "bert",
        {"kv": {"lengths": "[64]"}, **NO_NEEDLES},
        ["[kv]", "causal language model", "remove the [kv] section"],
    ),
    ("knockout-k", "llama", {"knockout": {"heads": "[7]"}}, ["[knockout] heads", "at most 6"]),
    (
        "rows",
        "llama",
        {"text": {"file": "@text", "max_tokens": "64"}},
        ["[text]", "gives 1 row of 64 tokens"],
    ),
    (
        "needles-text",
        "llama",
        {"roles": {"context": "2000"}, "text": {"file": "@text"}},
        ["[roles] needles = 1, context = 2000", "too short", "needles = 0 turns"],
    ),
]


@pytest.mark.parametrize(
    ("model", "changes", "words"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES]
)
def test_what_needs_the_model_is_checked_before_any_step(models, tmp_path, capsys, model,
                                                         changes, words):  # fmt: skip
    text = tmp_path / "text.txt"  # long enough for the load-time bound, too short for the runs
    text.write_text(" ".join(["alpha beta gamma delta epsilon zeta theta"] * 10))
    for fields in changes.values():
        for key, value in fields.items():
            if value == "@text":
                fields[key] = json.dumps(str(text))
    file = tmp_path / "study.toml"
    file.write_text(mutated(models[model], changes))
    assert exit_code(["study", "validate", str(file)]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    err = refused(["study", "run", str(file), "--out", str(out)], capsys)
    for word in words:
        assert word in err, (word, err)
    assert not list(out.glob("steps/*/done.json"))  # nothing was computed
    assert not (out / ".lock").exists()


def test_threads_bound_is_this_machines_cpus(models, tmp_path, capsys):
    file = tmp_path / "ok.toml"
    file.write_text(mutated(models["llama"], {"timing": {"threads": str(os.cpu_count())}}))
    assert exit_code(["study", "validate", str(file)]) == 0, capsys.readouterr().err
