"""Declarative studies: study files -> grid of cells -> cached, resumable runs -> report.

study = load_study("studies/quickstart.toml")       # or smoke_version(study) for CI
result = run_study(study, "results/quickstart", jobs=2)
report, outcomes = write_report("results/quickstart", study, result.tables, result.manifest)
"""

from probe.study.grid.report import report_from_dir, write_report
from probe.study.grid.spec import load_study, smoke_version
from probe.study.runner import load_tables, run_study

__all__ = ["load_study", "load_tables", "report_from_dir", "run_study", "smoke_version",
           "write_report"]  # fmt: skip
