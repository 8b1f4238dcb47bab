"""Declarative studies: a study file -> a plan of cached units -> one engine runs them -> report.

A grid study trains a grid of models (its units: cells); a head study measures one imported
model's heads (its units: steps). Both run through `probe.study.engine`; `probe.study.kinds`
says how each kind is read, planned and reported.

study = load_any("studies/quickstart.toml")        # either kind; smoke_of(study, path) for CI
result = run_study(study, "results/quickstart", jobs=2)
report, outcomes = kind_of(study).report(Path("results/quickstart"), study, result)
"""

from importlib import import_module
from typing import Any

# imported when first used (PEP 562): `probe.study.documents` reads a study file without torch,
# so the command line answers a typo'd study file before it imports the engine
_HOMES = {"kind_of": "kinds", "load_any": "kinds", "rebuild_report": "kinds", "smoke_of": "kinds",
          "load_tables": "runner", "run_study": "runner"}  # fmt: skip

__all__ = ["kind_of", "load_any", "load_tables", "rebuild_report", "run_study", "smoke_of"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'probe.study' has no attribute {name!r}")
    return getattr(import_module(f"probe.study.{_HOMES[name]}"), name)
