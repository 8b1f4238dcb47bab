"""Computing one unit, wherever it runs: the plan's context for this process, the unit's tables,
its folder in the cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from probe.study.engine.store import Store
from probe.study.engine.units import Plan, Progress, Record, Unit

# a worker process's contexts by plan (worker processes and Ray tasks only; a run in this
# process holds its context itself): a head study's model is imported once per worker
_WORKER_CONTEXTS: dict[tuple, Any] = {}


def worker_context(plan: Plan) -> Any:
    key = (type(plan).__name__, str(plan.root), plan.context_key())
    if key not in _WORKER_CONTEXTS:
        _WORKER_CONTEXTS.clear()  # one plan per worker at a time
        _WORKER_CONTEXTS[key] = plan.context()
    return _WORKER_CONTEXTS[key]


def compute(plan: Plan, unit: Unit, context: Any, progress: Progress) -> Record:
    """Run `unit` and write it into the cache (done.json last)."""
    start = time.perf_counter()
    tables, facts = unit.run(context, progress)
    return Store(plan.root, plan.folder).write(unit, tables, facts, time.perf_counter() - start)


def relayed(index: int, put: Callable[[tuple], None]) -> Progress:
    """Progress of unit `index` as plain tuples (they cross process boundaries)."""
    return lambda phase, done, total, note="": put((index, phase, done, total, note))
