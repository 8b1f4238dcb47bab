"""How much each attention head matters: five estimators, one tidy table (layer, head, method,
value).

- gradient (Michel et al. 2019): I_h = mean over examples of |dL(x)/dxi_h|, xi_h the head's gate.
  The absolute value is taken per example; one backward pass per batch gives every head at once.
  Per-example gate gradients come from the head outputs: head_out = xi_h * out_h, so
  dL(x)/dxi_h = sum over positions and dims of dL(x)/dhead_out[x, h] * head_out[x, h] / xi_h, and
  since examples never interact, the gradient of the summed loss w.r.t. head_out[x] is example x's
  own. Nothing accumulates between batches (torch.autograd.grad, no .grad buffers).
- fisher (Kwon et al. 2022): I_h = mean over examples of (dL(x)/dxi_h)^2, the diagonal of the
  empirical Fisher information of the head mask; the same per-example gradients as above.
- ablation: loss increase with the head's gate at 0 (layers x heads + 1 passes);
  mean-ablation: the head's output replaced by its mean over the data instead of by 0.
- confidence (Voita et al. 2019): mean over queries of the maximum attention weight.
- entropy: mean attention entropy in nats (LOW entropy = focused head, so pruning plans rank
  low entropy as important). Both come from `probe.measure.observe.AttentionStats` (fused
  attention).
- random: a seeded uniform baseline (Prasanna et al. 2020).

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
from probe.fields import choice
from probe.measure.batching import check_budget, micro_batches, split_batch
from probe.measure.evaluate import batch_loss, eval_batches, features_batch
from probe.measure.observe import AttentionStats
from probe.model import AttentionCall, Transformer
from probe.pruning.choices import ESTIMATORS, Method, parse_methods  # re-exported: old home
from probe.pruning.gate_gradients import gate_gradients
from probe.training.distributed import active_world

Progress = Callable[[int, int], None]  # (done, total)
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


# ----------------------------------------------------------------------- observers
class _HeadMeans:
    """Sum and count of each site's head outputs over examples and positions."""

    needs_weights = False

    def __init__(self) -> None:
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def record(self, call: AttentionCall) -> None:
        out = call.head_out.detach().double()  # [batch, head, q, d_head]
        self.sums[call.layer] = self.sums.get(call.layer, 0) + out.sum(dim=(0, 2))  # [head, d]
        self.counts[call.layer] = self.counts.get(call.layer, 0) + out.shape[0] * out.shape[2]


class _SkipEmpty:
    """Passes calls on to `inner` except those of sites left without heads by pruning."""

    def __init__(self, inner) -> None:
        self.inner, self.needs_weights = inner, inner.needs_weights

    def record(self, call: AttentionCall) -> None:
        if call.q.shape[1] > 0:
            self.inner.record(call)


# ----------------------------------------------------------------------- estimators
def _rows(model: Transformer, method: str, values: list[torch.Tensor]) -> list[dict]:
    """Table rows for the unmasked heads; values[layer] is [local head]."""
    rows = []
    for m, v in zip(model.attention_modules(), values, strict=True):
        for i, h in enumerate(m.kept_heads):
            if float(m.gate[i]) != 0.0:
                rows.append({"layer": m.layer, "head": h, "method": method, "value": float(v[i])})
    return rows


@torch.no_grad()
def mean_loss(model: Transformer, batches: Sequence[Batch],
              max_batch_tokens: int | None = None) -> float:  # fmt: skip
    """Mean per-example loss over all examples of `batches` (micro-batches of at most
    `max_batch_tokens` tokens; None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`)."""
    total, n = 0.0, 0
    for batch in micro_batches(batches, max_batch_tokens):
        total += batch_loss(model, batch, reduction="none").double().sum().item()
        n += batch.inputs.shape[0]
    return total / max(n, 1)


def _replace_with_mean(attn, local: int, mean: torch.Tensor):
    """A forward pre-hook on attn.o that puts `mean` [d_head] in place of head `local`'s output."""
    lo, hi = local * attn.d_head, (local + 1) * attn.d_head

    def hook(module, args):
        merged = args[0].clone()  # [batch, q, head * d_head]
        merged[..., lo:hi] = mean.to(merged.dtype)
        return (merged,)

    return attn.o.register_forward_pre_hook(hook)


@torch.no_grad()
def _ablation(model, batches, mean: bool, progress: Progress | None,
              max_batch_tokens: int | None = None):  # fmt: skip
    mods = model.attention_modules()
    means = None
    if mean:
        observer = _HeadMeans()
        with model.observe(observer):
            mean_loss(model, batches, max_batch_tokens)
        means = {k: observer.sums[k] / observer.counts[k] for k in observer.sums}  # [head, d]
    base = mean_loss(model, batches, max_batch_tokens)
    values = [torch.full((m.n_kept,), float("nan")) for m in mods]
    todo = [(m, i) for m in mods for i in range(m.n_kept) if float(m.gate[i]) != 0.0]
    for step, (m, i) in enumerate(todo):
        if mean:
            handle = _replace_with_mean(m, i, means[m.layer][i])
            try:
                values[m.layer][i] = mean_loss(model, batches, max_batch_tokens) - base
            finally:
                handle.remove()
        else:
            old = float(m.gate[i])
            m.gate[i] = 0.0
            try:
                values[m.layer][i] = mean_loss(model, batches, max_batch_tokens) - base
            finally:
                m.gate[i] = old
        if progress is not None:
            progress(step + 1, len(todo))
    return values


@torch.no_grad()
def _attention(model, batches, statistic: str, progress: Progress | None,
               max_batch_tokens: int | None = None):  # fmt: skip
    """Mean over query rows and examples of one `probe.measure.observe` statistic, per head."""
    observer = AttentionStats([statistic])
    with model.observe(_SkipEmpty(observer)):
        for step, batch in enumerate(batches):
            for part in split_batch(batch, max_batch_tokens):
                features_batch(model, part)
            if progress is not None:
                progress(step + 1, len(batches))
    table = observer.table().set_index(["layer", "head"])["value"]
    return [
        torch.tensor(
            [table.get((m.layer, h), float("nan")) for h in m.kept_heads], dtype=torch.float64
        )
        for m in model.attention_modules()
    ]


def head_importance(
    model: Transformer,
    batches: Sequence[Batch],
    method: Method | str = Method.GRADIENT,
    *,
    normalize: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Importance of every unmasked head on `batches`: tidy columns layer, head, method, value.

    normalize: divide each layer's values by their L2 norm (Michel et al.'s per-layer
    normalization). seed: only the random baseline uses it. max_batch_tokens: tokens per
    forward (and backward) pass; each batch runs in micro-batches of that size and every
    estimator sums over examples, so the values do not depend on it beyond float rounding
    (None: `probe.measure.batching.DEFAULT_BATCH_TOKENS`).
    """
    budget = check_budget(max_batch_tokens)
    method = choice(Method, method, "importance method")
    declared = ESTIMATORS[method]
    if active_world().size > 1 and not declared.data_parallel:
        parallel = " and ".join(m for m, e in ESTIMATORS.items() if e.data_parallel)
        raise ProbeError(
            f"importance '{method}' runs in one process; only {parallel} are "
            "data-parallel (their per-head sums are added over the processes)."
        )
    if not batches:
        raise ProbeError("Head importance needs at least one batch of data.")
    if declared.gradients and batches[0].objective == "embedding":
        raise ProbeError(
            "Gradient and Fisher importance are zero for a sentence encoder scored by "
            "similarity to its own embeddings (the loss is at its minimum before pruning); use "
            "--method ablation."
        )
    device = next(model.parameters()).device
    batches = [b.to(device) for b in batches]
    was_training = model.training
    model.eval()
    try:
        if method == Method.GRADIENT:
            values = gate_gradients(model, batches, progress, 1, budget)
        elif method == Method.FISHER:
            values = gate_gradients(model, batches, progress, 2, budget)
        elif method in (Method.ABLATION, Method.MEAN_ABLATION):
            values = _ablation(model, batches, method == Method.MEAN_ABLATION, progress, budget)
        elif method in (Method.CONFIDENCE, Method.ENTROPY):
            stat = "p_max" if method == Method.CONFIDENCE else "entropy"
            values = _attention(model, batches, stat, progress, budget)
        else:
            gen = torch.Generator().manual_seed(int(seed))
            values = [torch.rand(m.n_kept, generator=gen) for m in model.attention_modules()]
    finally:
        model.train(was_training)
    table = pd.DataFrame(_rows(model, str(method), values), columns=COLUMNS)
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
    low = [str(m) for m, e in ESTIMATORS.items() if e.low_is_important]
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
