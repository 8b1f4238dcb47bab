"""A head study's `[model] rope_scaling`: checked when the file is read, applied to the imported
model as transformers applies that scaling, held in every step's hash and in the manifest."""

from __future__ import annotations

import tomllib

import pytest
import torch
from cli_run import exit_code

from probe.study.engine.units import Settings
from probe.study.heads.plan import HeadPlan
from probe.study.heads.spec import head_study_dict, parse_head_study
from probe.study.heads.subject import Subject

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from test_cli_imported import hf_dir

    return hf_dir("llama", tmp_path_factory.mktemp("hf"))


def study_file(llama_dir, table: str | None) -> str:
    from test_head_study import study_text

    text = study_text(llama_dir)
    if table is None:
        return text
    return text.replace(f'source = "{llama_dir}"',
                        f'source = "{llama_dir}"\nrope_scaling = {table}')  # fmt: skip


@pytest.mark.parametrize("table, hf", [
    ('{ kind = "linear", factor = 2.0 }', {"rope_type": "linear", "factor": 2.0}),
    # yarn's original context left out: the model's max_position_embeddings (2048), as in HF
    ('{ kind = "yarn", factor = 4.0 }',
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}),
    ('{ kind = "dynamic", factor = 2.0, max_position_embeddings = 16 }',
     {"rope_type": "dynamic", "factor": 2.0}),
], ids=["linear", "yarn", "dynamic"])  # fmt: skip
def test_the_study_model_runs_the_scaling_as_transformers_does(llama_dir, table, hf):
    study = parse_head_study(tomllib.loads(study_file(llama_dir, table)))
    model = Subject(study).model
    config = transformers.AutoConfig.from_pretrained(llama_dir)
    config.rope_parameters = {"rope_theta": config.rope_parameters["rope_theta"], **hf}
    if hf["rope_type"] == "dynamic":
        config.max_position_embeddings = 16  # dynamic scales from the model's own context
    reference = transformers.LlamaForCausalLM.from_pretrained(llama_dir, config=config).eval()
    plain = transformers.LlamaForCausalLM.from_pretrained(llama_dir).eval()
    tokens = torch.randint(
        0, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        got = model(tokens)  # [batch, seq, vocab]
        want = reference(tokens).logits  # [batch, seq, vocab]
        unscaled = plain(tokens).logits
    gap = (got - want).abs().max().item()
    assert gap < 1e-5, gap
    # the scaling moves the logits far more than probe and transformers differ (weights at
    # initialization attend weakly, so the move is small in absolute terms)
    assert (unscaled - want).abs().max().item() > 20 * max(gap, 1e-6)


def test_the_scaling_is_in_every_step_hash_the_study_record_and_manifest(llama_dir, tmp_path):
    def plan(table):
        study = parse_head_study(tomllib.loads(study_file(llama_dir, table)))
        return HeadPlan(study, tmp_path, Settings(device="cpu"))

    plain, scaled = plan(None), plan('{ kind = "linear", factor = 2.0 }')
    before = {u.key: u.digest for u in plain.units({})}
    after = {u.key: u.digest for u in scaled.units({})}
    assert before.keys() == after.keys()
    assert all(before[k] != after[k] for k in before)
    assert head_study_dict(scaled.study)["rope_scaling"] == {"kind": "linear", "factor": 2.0}
    assert "rope_scaling" not in head_study_dict(plain.study)  # older results read the same
    run = {"wall_s": 0.0, "threads": 1}
    assert scaled.manifest([], dict(run))["rope_scaling"] == {"kind": "linear", "factor": 2.0}
    assert plain.manifest([], dict(run))["rope_scaling"] is None


@pytest.mark.parametrize("table, said", [
    ('{ kind = "lienar", factor = 2.0 }', "Did you mean 'linear'?"),
    ('{ kind = "linear", factr = 2.0 }', "has no field 'factr'. Did you mean 'factor'?"),
    ('{ kind = "linear", factor = 0.0 }', "'factor' must be a finite number > 0"),
    ('"linear"', "must be a table"),
])  # fmt: skip
def test_a_bad_rope_scaling_table_is_one_line_when_the_file_is_read(llama_dir, tmp_path, capsys,
                                                                    table, said):  # fmt: skip
    path = tmp_path / "study.toml"
    path.write_text(study_file(llama_dir, table))
    assert exit_code(["study", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "[model] rope_scaling" in err and said in err, err
