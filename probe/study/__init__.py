"""Declarative studies: a study file -> a plan of cached units -> one engine runs them -> report.

A grid study trains a grid of models (its units: cells); a head study measures one imported
model's heads (its units: steps). Both run through `probe.study.engine`; `probe.study.kinds`
says how each kind is read, planned and reported.

study = load_any("studies/quickstart.toml")        # either kind; smoke_of(study, path) for CI
result = run_study(study, "results/quickstart", jobs=2)
report, outcomes = kind_of(study).report(Path("results/quickstart"), study, result)
"""

from probe.study.kinds import kind_of, load_any, rebuild_report, smoke_of
from probe.study.runner import load_tables, run_study

__all__ = ["kind_of", "load_any", "load_tables", "rebuild_report", "run_study", "smoke_of"]
