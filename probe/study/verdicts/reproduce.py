"""Did this run reproduce the committed reference? A run of a shipped study writes to runs/NAME
(git-ignored); the committed results/NAME is its reference. The same cells (same configs, hence
the same keys) are compared table by table: identical when the seeds and the torch build match,
otherwise each summary number (exact match per arm, task and seen/unseen lengths, mean over
seeds) must have a 95% interval over seeds that overlaps the reference's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probe.errors import ProbeError
from probe.study.documents import read_json
from probe.study.engine.runner import load_tables
from probe.study.engine.workdir import MANIFEST
from probe.study.verdicts import summary

REFERENCE_ROOT = Path("results")
TOLERANCE = 0.01  # exact match: one point
# wall-clock columns, never compared: no two runs share them (prune_timing's ratio is pruned
# over original seconds; tokens_per_s is tokens over seconds)
TIMED = ("seconds", "min_seconds", "ratio", "tokens_per_s")


def reference_for(out: Path, name: str, smoke: bool) -> Path | None:
    """results/NAME when this run wrote elsewhere and that folder holds a finished run of the
    same study (smoke runs are not compared with full ones)."""
    ref = REFERENCE_ROOT / name
    if not (ref / MANIFEST).is_file() or ref.resolve() == Path(out).resolve():
        return None
    try:
        manifest = read_json(ref / MANIFEST)
    except ProbeError:
        return None  # a damaged reference is no reference
    if not isinstance(manifest, dict):
        return None
    if manifest.get("study") != name or bool(manifest.get("smoke")) != smoke:
        return None
    if manifest.get("n_done") != manifest.get("n_cells"):
        return None
    return ref


def same_values(a: pd.DataFrame, b: pd.DataFrame) -> tuple[bool, float]:
    """(identical, largest absolute difference of the value column) of two tables of the
    same cells, rows matched on every other column; wall-clock columns are left out (no two
    runs share them), and a table without a value column must match in every other column."""
    a, b = (t.drop(columns=[c for c in TIMED if c in t.columns]) for t in (a, b))
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False, float("nan")
    keys = [c for c in a.columns if c not in ("value", "min", "max", "n")]
    a = a.sort_values(keys, kind="stable").reset_index(drop=True)
    b = b.sort_values(keys, kind="stable").reset_index(drop=True)
    if not a[keys].astype(str).equals(b[keys].astype(str)):
        return False, float("nan")
    if "value" not in a.columns:
        return True, 0.0
    x, y = a["value"].to_numpy(float), b["value"].to_numpy(float)
    both = ~(np.isnan(x) & np.isnan(y))
    diff = float(np.nanmax(np.abs(x[both] - y[both]))) if both.any() else 0.0
    return diff == 0.0 and bool((np.isnan(x) == np.isnan(y)).all()), diff


def _summary(eval_table: pd.DataFrame) -> pd.DataFrame:
    exact = summary.metric_rows(eval_table, "exact_match")
    exact = exact.assign(lengths=np.where(summary.seen(exact), "seen", "unseen"))
    exact = exact[summary.seen(exact) | summary.unseen(exact)]
    return summary.over_seeds(exact, ["arm", "task", "lengths"])


def reproduction(tables: dict[str, pd.DataFrame], manifest: dict, ref: Path) -> str:
    """One sentence: whether this run's tables reproduce those of the reference folder."""
    ref_manifest = read_json(ref / MANIFEST)
    ref_tables = load_tables(ref)
    cells = set(tables["train"]["cell"]) if "train" in tables else set()
    common = cells & set(ref_tables["train"]["cell"]) if "train" in ref_tables else set()
    if not common:
        return (f"Reference: {ref} holds no cell with this run's configuration, so nothing is "
                "compared (the study file changed since the reference was run).")  # fmt: skip
    identical, largest, timed = True, 0.0, []
    for name, table in tables.items():
        if name not in ref_tables or name == "train":  # the training log carries wall times
            continue
        if any(c in table.columns for c in TIMED):
            timed.append(name)
        mine = table[table["cell"].isin(common)]
        theirs = ref_tables[name][ref_tables[name]["cell"].isin(common)]
        same, diff = same_values(mine.reset_index(drop=True), theirs.reset_index(drop=True))
        identical = identical and same
        largest = max(largest, diff) if not np.isnan(diff) else largest
    torch_here = manifest.get("versions", {}).get("torch", "?")
    torch_there = ref_manifest.get("versions", {}).get("torch", "?")
    where = f"the committed reference {ref}"
    if identical:
        clocks = f"; wall-clock times in {', '.join(timed)} are not compared" if timed else ""
        return (f"This run reproduced {where} exactly: every result table of its {len(common)} "
                f"cells is identical (same seeds; torch {torch_here} here and there"
                f"{clocks}).")  # fmt: skip
    if "eval" not in tables or "eval" not in ref_tables:
        return (f"This run differs from {where} (largest difference in a table value "
                f"{largest:.3g}; torch {torch_here} here, {torch_there} there).")  # fmt: skip
    here = _summary(tables["eval"][tables["eval"]["cell"].isin(common)])
    there = _summary(ref_tables["eval"][ref_tables["eval"]["cell"].isin(common)])
    both = here.merge(there, on=["arm", "task", "lengths"], suffixes=("", "_ref"))
    ref_low = both["low_ref"].fillna(both["mean_ref"]) - 1e-9
    ref_high = both["high_ref"].fillna(both["mean_ref"]) + 1e-9
    low, high = both["low"].fillna(both["mean"]), both["high"].fillna(both["mean"])
    # the two 95% intervals overlap, or come within TOLERANCE (two seeds that agree give an
    # interval of width 0, and one example in a thousand is not a failure to reproduce)
    inside = (low <= ref_high + TOLERANCE) & (high >= ref_low - TOLERANCE)
    outside = both[~inside]
    listed = "; ".join(
        f"{r.arm} {r.task} {r.lengths} {r.mean:.2f} (reference {r.mean_ref:.2f} "
        f"[{r.low_ref:.2f}, {r.high_ref:.2f}])"
        for r in outside.itertuples()
    )
    verdict = "reproduced" if outside.empty else "did not reproduce"
    return (
        f"This run {verdict} {where} within its intervals: {int(inside.sum())} of {len(both)} "
        "summary numbers (exact match per arm, task and seen or unseen lengths, mean over "
        "seeds) have 95% intervals over seeds that overlap the reference's or come within "
        f"{TOLERANCE:g} of it"
        + (f"; outside: {listed}" if listed else "")
        + f" (not identical: torch {torch_here} here, {torch_there} there; largest difference "
        f"in a table value {largest:.3g})."
    )


def verdict(out: Path, name: str, smoke: bool, tables: dict[str, pd.DataFrame],
            manifest: dict, compare=reproduction) -> str:  # fmt: skip
    """The last line of `probe study run`: whether the run reproduced the committed reference
    results/NAME (`compare(tables, manifest, reference)`: the study kind's comparison), or why
    there is nothing to compare it with."""
    ref = reference_for(out, name, smoke)
    if ref is not None:
        return compare(tables, manifest, ref)
    committed = REFERENCE_ROOT / name
    if committed.resolve() == Path(out).resolve():
        return (f"This run wrote the committed reference {committed} itself, so there is nothing "
                "to compare it with.")  # fmt: skip
    if smoke:
        return (f"A smoke run is not compared with the committed reference {committed} (a full "
                "run's).")  # fmt: skip
    return (f"No finished run of this study in {committed} to compare with, so this run is not "
            f"checked against a reference (`--out {committed}` makes one).")  # fmt: skip
