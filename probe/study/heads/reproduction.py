"""Whether a head study's run reproduced its committed reference: every table value for value,
but the timings (wall clock)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probe.errors import ProbeError
from probe.study.documents import read_json
from probe.study.engine.workdir import MANIFEST
from probe.study.heads.plan import read_head_tables
from probe.study.verdicts.reproduce import same_values


def head_reproduction(tables: dict[str, pd.DataFrame], manifest: dict, ref: Path) -> str:
    """One sentence: whether a head study's tables are those of the reference folder (timings
    are wall clock and never compared; every other table must match value for value)."""
    ref_manifest = read_json(ref / MANIFEST)
    where = f"the committed reference {ref}"
    try:
        ref_tables = read_head_tables(ref)
    except ProbeError:
        return f"{where[0].upper()}{where[1:]} has no tables yet (its run has not finished)."
    torch_here = manifest.get("versions", {}).get("torch", "?")
    torch_there = ref_manifest.get("versions", {}).get("torch", "?")
    compared, differ, largest = [], [], 0.0
    for kind in sorted(set(tables) | set(ref_tables)):
        if kind == "timing":
            continue
        if kind not in tables or kind not in ref_tables:
            differ.append(kind)
            continue
        compared.append(kind)
        same, diff = same_values(tables[kind].reset_index(drop=True), ref_tables[kind])
        if not same:
            differ.append(kind)
        largest = max(largest, diff) if not np.isnan(diff) else largest
    if not differ:
        return (f"This run reproduced {where} exactly: its tables ({', '.join(compared)}) are "
                f"identical (torch {torch_here} here and there; timings are wall clock and not "
                "compared).")  # fmt: skip
    return (f"This run did not reproduce {where} exactly: {', '.join(differ)} differ (largest "
            f"difference in a table value {largest:.3g}; torch {torch_here} here, {torch_there} "
            "there; timings are wall clock and not compared).")  # fmt: skip
