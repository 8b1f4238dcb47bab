"""One schema per table kind, whichever study writes it, and the step that reads older tables
into it.

Every table is long (CONVENTIONS: tables before plots): one measured quantity per row, named in
a `statistic` or `metric` column with its number in `value`, beside the identifiers of the run.
A grid study's cell adds its identity columns (cell, arm, variant, factors, task, seed, L_min,
L); a head study adds none (one model). The measured part is the same in both kinds:

- roles: `layer, site, head, statistic, value, offset`. A role score is a statistic of the
  head's attention (as in the attention table, whose sibling it is): `statistic` names the role
  (previous_token, induction, positional, sink; retrieval in the retrieval table, which keeps its
  context columns after these), `offset` the positional role's best offset. Head studies wrote
  `role, score` before.
- curves: `fraction, method, seed, metric, value, n_pruned, unit`: scored `metric`s after
  removing the `fraction` of heads (`n_pruned` of them) that `method`, estimated on importance
  split `seed`, ranks least important; `unit` is what is removed (head, or group: a whole
  key/value group). In a grid cell `seed` is the cell's training seed, so the importance split
  is named `split` there, and the cell adds `n_heads`. Grid cells wrote no `unit` before (heads
  only).
- importance: `layer, head, method, value` (the importance split `seed` beside it in a head
  study; `probe.pruning.importance.head_importance` returns these four).

`normalise` is applied wherever a stored table is read (cached cells and steps, gathered
tables), so results written before stay valid: their keys hash what a step does, not its
columns.
"""

from __future__ import annotations

import pandas as pd

ROLE_COLUMNS = ["layer", "site", "head", "statistic", "value", "offset"]
CURVE_COLUMNS = ["fraction", "method", "seed", "metric", "value", "n_pruned", "unit"]
IMPORTANCE_COLUMNS = ["layer", "head", "method", "value"]

# the names earlier versions wrote, per table kind (a head study's "curves" table, a grid
# study's "pruning" table: the same schema)
_RENAMED = {"roles": {"role": "statistic", "score": "value"},
            "retrieval": {"role": "statistic", "score": "value"}}  # fmt: skip
_CURVES = ("curves", "pruning")


def normalise(kind: str, table: pd.DataFrame) -> pd.DataFrame:
    """`table` (of table kind `kind`: roles, retrieval, curves, pruning, ...) with the columns of
    its kind's one schema: old names renamed in place, a missing `unit` (curves written before
    group pruning, always by head) added after n_pruned. Tables already in the schema, and kinds
    with no older form, come back as they are."""
    renamed = {a: b for a, b in _RENAMED.get(kind, {}).items() if a in table.columns}
    if renamed and not set(renamed.values()) & set(table.columns):
        table = table.rename(columns=renamed)
    if kind in _CURVES and "n_pruned" in table.columns and "unit" not in table.columns:
        table = table.copy()
        table.insert(table.columns.get_loc("n_pruned") + 1, "unit", "head")
    return table


def normalise_all(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """`normalise` applied to every table of a {kind: table} mapping."""
    return {kind: normalise(kind, table) for kind, table in tables.items()}
