"""The study engine: one runner for every kind of study.

A study kind plans units of work (`Plan`); each unit has a key, a digest of everything it
depends on and `run(context, progress) -> tables`. The runner (`run_plan`) holds the results
directory's lock, reuses finished units from the checksummed cache, runs the rest here, in local
processes or on Ray, reports progress, writes the manifest and gathers the tables.
"""

from probe.study.engine.runner import RunResult, run_plan
from probe.study.engine.units import Event, Plan, Record, Settings, Unit

__all__ = ["Event", "Plan", "Record", "RunResult", "Settings", "Unit", "run_plan"]
