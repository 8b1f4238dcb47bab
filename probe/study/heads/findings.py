"""What a head study's report reads from one results directory: its study description, manifest
and tables, and the numbers every section and verdict shares (the model's facts, its primary
metric, the operating points, the measured speed-ups). Built by `report.read_findings`."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from probe.kv.summary import by_length, targets
from probe.pruning.objectives import primary
from probe.study.heads import evidence as ev


class Findings:
    """One finished head study run, read: `study` (study.json), `manifest`, `tables` by kind."""

    def __init__(self, out: Path, study: dict[str, Any], manifest: dict[str, Any],
                 tables: dict[str, pd.DataFrame]) -> None:  # fmt: skip
        self.out = Path(out)
        self.study = study
        self.manifest = manifest
        self.tables = tables
        self.facts = tables["model"].iloc[0]
        self.objective = str(self.facts.objective)
        self.metric, self.higher = primary(self.objective)
        self.n_heads = int(self.facts.n_layer * self.facts.n_head)
        self.tolerance = float(study["operating"]["tolerance"])
        self.curves = tables.get("curves", pd.DataFrame())
        self.ops = (ev.operating_summary(self.curves, self.objective, self.tolerance,
                                         self.n_heads) if not self.curves.empty
                    else pd.DataFrame())  # fmt: skip
        self.speed = ev.speed(tables.get("timing", pd.DataFrame()))
        self.signs = ev.speed_signs(self.speed) if not self.speed.empty else pd.DataFrame()

    @cached_property
    def kv(self) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """The key/value plans' table per length (`probe.kv.summary.by_length`) and their
        targets, read once for the section, the answer and the claims (None: no plans)."""
        kv = self.tables.get("kv")
        if kv is None or kv.empty:
            return None
        table = by_length(kv)
        return table, targets(table)

    def criterion(self) -> str:
        if self.metric == "similarity":
            return f"mean cosine similarity to the unpruned embeddings >= {1 - self.tolerance:.2f}"
        return f"held-out loss within +{self.tolerance:g} nats of the unpruned model's"

    def threshold(self) -> float:
        """Where the primary metric meets the tolerance (from the unpruned model's score)."""
        base = float(self.facts[self.metric])
        return base - self.tolerance if self.higher else base + self.tolerance

    def best(self) -> pd.Series | None:
        if self.ops.empty:
            return None
        mine = self.ops[(self.ops.method != "random") & (self.ops.unit == "head")]
        if mine.empty:
            return None
        keys = ["min_fraction", "max_fraction", "value"]  # ties: the better metric there
        return mine.sort_values(keys, ascending=[False, False, not self.higher]).iloc[0]
