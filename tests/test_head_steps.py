"""The step kinds of a head study: gathered from their modules, in one order for the plan, the
table names and the report."""

import re
import tomllib
from pathlib import Path

import pytest

from probe.errors import ProbeError
from probe.study.heads.spec import parse_head_study
from probe.study.heads.steps import (
    plan_steps,
    report_sections,
    step_count,
    step_kind,
    step_kinds,
    table_names,
)


@pytest.mark.parametrize("name", ["minilm-heads", "smollm2-heads", "smollm2-kv"])
def test_the_kinds_a_study_plans_are_the_tables_its_run_wrote(name, plans_only):
    study = parse_head_study(tomllib.loads(Path(f"studies/{name}.toml").read_text()))
    planned = {kind for _, kind, _ in plan_steps(study)}
    later = {k.name for k in step_kinds() if k.later is not None and k.later.expected(study)}
    written = {p.stem for p in Path(f"results/{name}/tables").glob("*.csv")}
    assert planned | later == written
    assert set(written) <= set(table_names())
    keys = [key for key, _, _ in plan_steps(study)]
    assert len(set(keys)) == len(keys)  # one folder per step
    manifest = Path(f"results/{name}/manifest.json").read_text()
    assert step_count(study) == manifest.count('"key"')


def test_sections_come_in_the_order_of_the_committed_report():
    """The report's level-2 headings of the step sections, in the order of `report_sections()`."""
    text = Path("results/smollm2-heads/report.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    ours = ["Set-up", "How many heads can go", "How much faster", "Do the estimators agree?",
            "What the heads do"]  # fmt: skip
    assert [h for h in headings if h in ours] == ours
    names = [s.name for s in report_sections()]
    assert names.index("set-up") < names.index("pruning") < names.index("timing")
    assert names.index("timing") < names.index("importance") < names.index("roles")


def test_an_unknown_step_kind_names_the_nearest():
    assert step_kind("curves").name == "curves"
    with pytest.raises(ProbeError, match=r"Unknown head study step kind 'curve'\. Did you mean"):
        step_kind("curve")
