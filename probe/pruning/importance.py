"""How much each attention head matters: `head_importance` runs one estimator and gives one tidy
table (layer, head, method, value); `compare_estimators` runs several and correlates them.

The estimators are the modules of `probe.pruning.estimators`, each declaring its name, direction
and what it computes (gradient and fisher, ablation and mean-ablation, confidence and entropy,
random); `head_importance` runs the one named and turns its per-site values into rows.

Heads whose gate is already 0 (masked) get no row. `layer` is the attention site index, `head` the
original head id. Importance data must be disjoint from the data a pruned model is scored on:
`disjoint_splits` builds both and removes any example the two share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import torch
from scipy.stats import spearmanr

from probe.data.tasks import Batch, Form, TaskConfig
from probe.errors import ProbeError
from probe.measure.batching import check_budget
from probe.measure.evaluate import eval_batches
from probe.model import Transformer
from probe.pruning.choices import parse_methods  # re-exported: its old home
from probe.pruning.estimators import ESTIMATORS, Given, Progress
from probe.training.distributed import active_world

COLUMNS = ["layer", "head", "method", "value"]


# --------------------------------------------------------------------------- data
def example_keys(batch: Batch) -> list[bytes]:
    """One byte string per example: its decoder tokens and (encoder-decoder) source tokens."""
    keys = []
    for i in range(batch.inputs.shape[0]):
        key = batch.inputs[i].cpu().numpy().tobytes()
        if batch.source is not None:
            key += b"|" + batch.source[i].cpu().numpy().tobytes()
        keys.append(key)
    return keys


def without(batches: Sequence[Batch], exclude: Sequence[Batch]) -> list[Batch]:
    """`batches` minus every example that also occurs in `exclude` (empty batches dropped)."""
    seen = {key for b in exclude for key in example_keys(b)}
    out = []
    for b in batches:
        keep = torch.tensor([k not in seen for k in example_keys(b)], dtype=torch.bool)
        if keep.all():
            out.append(b)
        elif keep.any():
            out.append(b.rows(keep))
    return out


def disjoint_splits(
    task: TaskConfig,
    form: Form | str,
    lengths: Sequence[int],
    *,
    batch_size: int = 64,
    n_batches: int = 1,
    seed: int = 0,
    n_importance: int = 1,
) -> tuple[list[list[Batch]], list[Batch]]:
    """(importance splits, evaluation split). The evaluation split comes from `seed`; importance
    split r from seed + 1 + r, with every example that also occurs in the evaluation split removed.
    """
    scoring = eval_batches(task, form, lengths, batch_size, n_batches, seed)
    splits = []
    for r in range(n_importance):
        candidate = eval_batches(task, form, lengths, batch_size, n_batches, seed + 1 + r)
        split = without(candidate, scoring)
        if not split:
            raise ProbeError(
                f"Every importance example at lengths {list(lengths)} also occurs in the "
                "evaluation split (too few distinct examples); use longer lengths."
            )
        splits.append(split)
    return splits, scoring


# ---------------------------------------------------------------------------- table
def _rows(model: Transformer, method: str, values: list[torch.Tensor]) -> list[dict]:
    """Table rows for the unmasked heads; values[layer] is [local head]."""
    rows = []
    for m, v in zip(model.attention_modules(), values, strict=True):
        for i, h in enumerate(m.kept_heads):
            if float(m.gate[i]) != 0.0:
                rows.append({"layer": m.layer, "head": h, "method": method, "value": float(v[i])})
    return rows


def head_importance(
    model: Transformer,
    batches: Sequence[Batch],
    method: str = "gradient",
    *,
    normalize: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Importance of every unmasked head on `batches` by the estimator called `method` (a module
    of `probe.pruning.estimators`): tidy columns layer, head, method, value.

    normalize: divide each layer's values by their L2 norm (Michel et al.'s per-layer
    normalization). seed: only the random baseline uses it. max_batch_tokens: tokens per
    forward (and backward) pass; each batch runs in micro-batches of that size and every
    estimator sums over examples, so the values do not depend on it beyond float rounding
    (None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`).
    """
    budget = check_budget(max_batch_tokens)
    declared = ESTIMATORS.get(str(method))
    if active_world().size > 1 and not declared.data_parallel:
        parallel = " and ".join(e.name for e in ESTIMATORS if e.data_parallel)
        raise ProbeError(
            f"importance '{declared.name}' runs in one process; only {parallel} are "
            "data-parallel (their per-head sums are added over the processes)."
        )
    if not batches:
        raise ProbeError("Head importance needs at least one batch of data.")
    if declared.gradients and batches[0].objective == "embedding":
        differentiating = " and ".join(e.name.capitalize() for e in ESTIMATORS if e.gradients)
        raise ProbeError(
            f"{differentiating} importance are zero for a sentence encoder scored by "
            "similarity to its own embeddings (the loss is at its minimum before pruning); use "
            "--method ablation."
        )
    device = next(model.parameters()).device
    batches = [b.to(device) for b in batches]
    was_training = model.training
    model.eval()
    try:
        given = Given(seed=seed, progress=progress, max_batch_tokens=budget)
        values = declared.compute(model, batches, given)
    finally:
        model.train(was_training)
    shapes = [(m.n_kept,) for m in model.attention_modules()]
    if [tuple(v.shape) for v in values] != shapes:  # a new estimator's slip, named at once
        raise ProbeError(f"the {declared.name} estimator gave values of shapes "
                         f"{[tuple(v.shape) for v in values]}, not one per kept head of each "
                         f"attention site {shapes}.")  # fmt: skip
    table = pd.DataFrame(_rows(model, declared.name, values), columns=COLUMNS)
    return normalize_per_layer(table) if normalize else table


def normalize_per_layer(table: pd.DataFrame) -> pd.DataFrame:
    """Each (method, layer)'s values divided by their L2 norm (left alone when the norm is 0)."""
    norm = table.groupby(["method", "layer"])["value"].transform(lambda v: (v**2).sum() ** 0.5)
    return table.assign(value=table["value"] / norm.where(norm > 0, 1.0))


def importance_correlations(table: pd.DataFrame) -> pd.DataFrame:
    """Spearman rank correlation between every pair of estimators over the heads they share.

    Columns method, other, rho, p_value, n. Values are compared as importance (negated where
    low is important: entropy), so a positive rho always means the two estimators agree on
    which heads matter.
    """
    low = [e.name for e in ESTIMATORS if e.low_is_important]
    signed = table["value"].where(~table["method"].isin(low), -table["value"])
    wide = table.assign(value=signed).pivot_table(
        index=["layer", "head"], columns="method", values="value"
    )
    order = list(dict.fromkeys(table["method"]))
    rows = []
    for a in order:
        for b in order:
            both = wide[a].notna() & wide[b].notna()
            x, y = wide[a][both], wide[b][both]
            rho, p = (float("nan"), float("nan"))
            if len(x) >= 2 and x.nunique() > 1 and y.nunique() > 1:
                rho, p = spearmanr(x, y)
            rows.append(
                {
                    "method": a,
                    "other": b,
                    "rho": float(rho),
                    "p_value": float(p),
                    "n": int(both.sum()),
                }
            )
    return pd.DataFrame(rows, columns=["method", "other", "rho", "p_value", "n"])


def compare_estimators(
    model: Transformer,
    batches: Sequence[Batch],
    methods: str | Sequence[str],
    *,
    normalize: bool = False,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
    max_batch_tokens: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(importance table of every method, Spearman correlations between them);
    progress(method, done, total)."""
    tables = []
    for method in parse_methods(methods):
        report = None if progress is None else (lambda d, t, m=method: progress(m, d, t))
        table = head_importance(model, batches, method, normalize=normalize, seed=seed,
                                progress=report, max_batch_tokens=max_batch_tokens)  # fmt: skip
        tables.append(table)
    table = pd.concat(tables, ignore_index=True)
    return table, importance_correlations(table)
