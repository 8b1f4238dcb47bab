"""A step kind with its own section of the study file is one declaration: a toy [norms] kind
(each layer's output-projection weight norm, with one bounded option), added to the registry for
the test only, is read, checked, planned, run and reported with no other file touched; and the
declarations import without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from probe.errors import ProbeError
from probe.options import option
from probe.study.heads.spec import parse_head_study, top_level
from probe.study.heads.step import Section, StepKind, StudySection
from probe.study.heads.steps import KINDS, plan_steps, report_sections, study_sections

pytest.importorskip("transformers")


@dataclass(frozen=True)
class NormOptions:
    power: float = option(2.0, low=1, help="the order p of the p-norm")


def norms(subject, options, given, progress) -> pd.DataFrame:
    import torch

    p = options["power"]
    rows = [{"layer": i, "power": p,
             "norm": float(torch.linalg.vector_norm(a.o.weight.detach().float(), ord=p))}
            for i, a in enumerate(subject.model.attention_modules())]  # fmt: skip
    return pd.DataFrame(rows)


def norms_section(r, rep) -> None:
    table = r.tables.get("norms")
    if table is not None:
        rep.heading("Output-projection norms")
        rep.table(table, "norms.csv", digits=4)


NORMS = StepKind(
    "norms", 20, norms, lambda study: [("norms", {"power": study.norms.power})],
    section=StudySection("norms", 80, NormOptions, turns_on=True),
    reports=(Section("norms", 90, norms_section),),
)  # fmt: skip


def study_text(source: Path | str, norms: str = "power = 2.0") -> str:
    return f"""
[study]
name = "toy-norms"
question = "How large are the output projections?"

[model]
source = "{source}"

[text]
max_tokens = 16
batch_size = 2
batches = 1
seeds = 1

[norms]
{norms}
"""


def parsed(text: str, path: Path | None = None):
    import tomllib

    return parse_head_study(tomllib.loads(text), path)


def test_the_toy_section_is_read_and_checked_only_while_declared(plans_only):
    with KINDS.added(NORMS):
        assert "norms" in top_level() and "norms" in [s.name for s in study_sections()]
        study = parsed(study_text("x", "power = 3"), Path("s.toml"))
        assert study.norms == NormOptions(power=3.0)
        assert ("norms", "norms", {"power": 3.0}) in plan_steps(study)
        with pytest.raises(ProbeError, match=r"^s\.toml \[norms\] power must be at least 1 "
                           r"\(the order p of the p-norm\), got 0\.5\.$"):  # fmt: skip
            parsed(study_text("x", "power = 0.5"), Path("s.toml"))
        with pytest.raises(ProbeError, match=r"Unknown s\.toml \[norms\] field 'powr'\. Did you "
                           r"mean 'power'\?"):  # fmt: skip
            parsed(study_text("x", "powr = 2"), Path("s.toml"))
        without = parsed(study_text("x").replace("[norms]\npower = 2.0", ""))
        assert "norms" not in [kind for _, kind, _ in plan_steps(without)]  # turned on by [norms]
    assert "norms" not in top_level() and "norms" not in KINDS
    with pytest.raises(ProbeError, match=r"unknown field 'norms'"):
        parsed(study_text("x"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from test_cli_imported import hf_dir

    return hf_dir("llama", tmp_path_factory.mktemp("hf"))


def test_the_toy_kind_runs_and_reports_its_table(llama_dir, tmp_path):
    """The norms it writes are those of the Hugging Face weights, computed apart."""
    import torch
    from safetensors.torch import load_file

    from probe.study.runner import run

    file = tmp_path / "norms.toml"
    file.write_text(study_text(llama_dir))
    with KINDS.added(NORMS):
        assert [s.name for s in report_sections()][-1] == "norms"
        done = run(file, tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "tables" / "norms.csv")
    weights = load_file(str(Path(llama_dir) / "model.safetensors"))
    expected = [float(torch.linalg.vector_norm(weights[f"model.layers.{i}.self_attn.o_proj.weight"]
                                               .float())) for i in range(len(table))]  # fmt: skip
    assert len(table) == 2 and table.norm.tolist() == pytest.approx(expected, rel=1e-5)
    assert "## Output-projection norms" in done.report.read_text()
    assert json.loads((tmp_path / "out" / "study.json").read_text())["norms"] == {"power": 2.0}


def test_the_step_declarations_import_without_torch():
    code = ("import sys; from probe.study.heads.steps import KINDS, study_sections; "
            "KINDS.names(); study_sections(); "
            "assert 'torch' not in sys.modules, 'torch imported'")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_section_may_not_take_the_name_of_a_study_file_s_own_table():
    from dataclasses import replace

    from probe.errors import ProbeError
    from probe.study.heads.steps import study_sections

    model = replace(NORMS, name="model-norms", section=StudySection("model", 80, NormOptions))
    with (
        KINDS.added(model),
        pytest.raises(
            ProbeError,
            match=r"the model-norms step kind's "
            r"section is called 'model', a table every head study",
        ),
    ):
        study_sections()
