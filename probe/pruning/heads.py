"""Removing attention heads: masks, pruning plans, and physical pruning.

Heads are always named by (layer, head) with `layer` the attention site's index in
`ModelConfig.sites()` and `head` the head's ORIGINAL id, so a pruned model's heads keep
the numbers they had before any pruning.

- `head_mask` / `masked`: gates at 0 for the removed heads (the model keeps its size);
- `plan_removal`: which heads go, from an importance table (global or per-layer quota, a minimum of
  heads kept per layer);
- `prune_heads`: a NEW, smaller Transformer in which every attention module has sliced its own
  per-head parameters to the kept heads (`Attention.prune`). Its logits equal the masked model's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.fields import choice
from probe.model import Transformer
from probe.pruning.choices import Scope, estimator  # Scope re-exported: its old home
from probe.pruning.importance import head_importance
from probe.words import counted

Progress = Callable[[int, int], None]  # (done, total)
Heads = Iterable[tuple[int, int]]  # (layer, original head id) pairs

# estimators whose value is LARGER for a LESS important head (entropy: a diffuse head)


# ------------------------------------------------------------------ naming and checking
def present_heads(model: Transformer) -> list[tuple[int, ...]]:
    """Original ids of the heads each attention site holds and has not masked (gate != 0)."""
    return [
        tuple(h for h, g in zip(m.kept_heads, m.gate.tolist(), strict=True) if g != 0.0)
        for m in model.attention_modules()
    ]


def _sites_text(model: Transformer) -> str:
    sites = [s.name for s in model.cfg.sites()]
    return f"layers 0-{len(sites) - 1}: " + ", ".join(sites)


def check_heads(model: Transformer, heads: Heads) -> dict[int, set[int]]:
    """{layer: {original head ids}}, after checking that every (layer, head) exists."""
    mods = model.attention_modules()
    out: dict[int, set[int]] = {}
    for layer, head in heads:
        layer, head = int(layer), int(head)
        if not 0 <= layer < len(mods):
            raise ProbeError(
                f"Layer {layer} does not exist: the model has "
                f"{counted(len(mods), 'attention site')} ({_sites_text(model)}). Use a layer "
                "index from that list."
            )
        if head not in mods[layer].kept_heads:
            have = ", ".join(map(str, mods[layer].kept_heads)) or "none"
            raise ProbeError(
                f"Head {head} is not in layer {layer} ({mods[layer].site}); the heads it holds "
                f"(original ids) are: {have}. Heads already pruned cannot be removed again."
            )
        out.setdefault(layer, set()).add(head)
    return out


# ------------------------------------------------------------------------- masking
def head_mask(model: Transformer, heads: Heads) -> list[torch.Tensor]:
    """The model's current gates with the given heads set to 0, in site order ([head] each)."""
    remove = check_heads(model, heads)
    gates = []
    for m in model.attention_modules():
        gate = m.gate.detach().clone()  # [head]
        for i, h in enumerate(m.kept_heads):
            if h in remove.get(m.layer, ()):
                gate[i] = 0.0
        gates.append(gate)
    return gates


@contextmanager
def masked(model: Transformer, heads: Heads) -> Iterator[Transformer]:
    """Within the block the given heads' gates are 0; the previous gates come back afterwards."""
    before = [g.detach().clone() for g in model.gates()]
    model.set_gates(head_mask(model, heads))
    try:
        yield model
    finally:
        model.set_gates(before)


# --------------------------------------------------------------------- physical pruning
def prune_heads(model: Transformer, heads: Heads, in_place: bool = False) -> Transformer:
    """A Transformer without the given (layer, original head) pairs: a new one, or with
    `in_place` the same model made smaller (no second copy of the weights: what a model as
    large as the memory needs).

    Each attention module slices its own per-head parameters (`Attention.prune`); with
    grouped-query attention a key/value head goes when no kept query head reads it. The new
    config's `kept_heads` lists the kept original ids per site, so pruning a pruned model keeps
    the original numbering; a site may lose every head, leaving only W_O's bias. Every tensor's
    name and shape is checked against a model built from the new config (on the meta device:
    no memory), so a checkpoint of the result loads.
    """
    remove = check_heads(model, heads)
    work = model if in_place else copy.deepcopy(model)
    for m in work.attention_modules():
        gone = remove.get(m.layer, set())
        if gone:
            m.prune([h for h in m.kept_heads if h not in gone])
    kept = tuple(m.kept_heads for m in work.attention_modules())
    work.cfg = dataclasses.replace(model.cfg, kept_heads=kept)
    with warnings.catch_warnings():  # empty sites initialise zero-element tensors
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        shapes = {
            k: v.shape for k, v in Transformer.empty(work.cfg, device="meta").state_dict().items()
        }
    state = {k: v.shape for k, v in work.state_dict().items()}
    if state != shapes:  # a slicing bug: never write a checkpoint that would not load
        wrong = sorted(set(state.items()) ^ set(shapes.items()), key=str)[:3]
        raise RuntimeError(f"pruned model does not match its config: {wrong}")
    return work


# ---------------------------------------------------------------------------- plans
def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """layer, head, score: one method's importance with larger = more important."""
    methods = table["method"].unique()
    if len(methods) != 1:
        raise ProbeError(f"A pruning plan needs one estimator's table, got {list(methods)}.")
    score = table["value"].astype(float)
    declared = estimator(str(methods[0]))
    if declared is not None and declared.low_is_important:
        score = -score
    out = table[["layer", "head"]].astype(int).assign(score=score.to_numpy())
    if out["score"].isna().any():
        raise ProbeError(f"The {methods[0]} importance has missing values; cannot rank heads.")
    return out


def n_to_remove(fraction: float, n_heads: int) -> int:
    """round(fraction * n_heads) (halves round up), with a clear error outside [0, 1]."""
    if not 0.0 <= float(fraction) <= 1.0:
        raise ProbeError(f"The fraction of heads to prune must be between 0 and 1, got {fraction}.")
    return math.floor(float(fraction) * n_heads + 0.5 + 1e-9)


def check_counts(
    present: list[tuple[int, ...]], counts: int | list[int], min_heads_per_layer: int = 0
) -> None:
    """A ProbeError unless `counts` heads (global, or per site) can go while every site keeps
    at least `min_heads_per_layer` of the heads it has."""
    if min_heads_per_layer < 0:
        raise ProbeError(f"--min-heads-per-layer must be 0 or more, got {min_heads_per_layer}.")
    total = sum(len(h) for h in present)
    n_remove = _total(counts)
    if n_remove > total:
        raise ProbeError(
            f"Cannot prune {counted(n_remove, 'head')}: the model has only "
            f"{counted(total, 'head')} in {counted(len(present), 'attention site')}. Ask for at "
            f"most {total}."
        )
    if isinstance(counts, int):
        removable = sum(max(0, len(h) - min_heads_per_layer) for h in present)
        if n_remove > removable:
            raise ProbeError(
                f"Cannot prune {n_remove} of {counted(total, 'head')} while keeping at least "
                f"{min_heads_per_layer} per layer: at most {removable} can go. Lower the "
                "fraction or --min-heads-per-layer."
            )
        return
    if len(counts) != len(present):
        raise ProbeError(
            f"Per-layer counts for {counted(len(counts), 'site')}; the model has {len(present)}."
        )
    for layer, (heads, count) in enumerate(zip(present, counts, strict=True)):
        if len(heads) - count < min_heads_per_layer:
            raise ProbeError(
                f"Layer {layer} has {counted(len(heads), 'head')}: removing {count} leaves "
                "fewer than "
                f"--min-heads-per-layer {min_heads_per_layer}. Lower the fraction or the minimum."
            )


def plan_removal(
    table: pd.DataFrame,
    present: list[tuple[int, ...]],
    counts: int | list[int],
    *,
    min_heads_per_layer: int = 0,
) -> list[tuple[int, int]]:
    """The least important heads among `present` (per site, original ids).

    counts: an int ranks every head together (global quota), skipping layers already down to
    `min_heads_per_layer`; a list gives the number to remove from each site (per-layer quota).
    Ties go to the lower (layer, head). Asking for more than can go is a ProbeError.
    """
    check_counts(present, counts, min_heads_per_layer)
    n_remove = _total(counts)
    rank = ranking(table)
    keep = {(layer, h) for layer, heads in enumerate(present) for h in heads}
    rank = rank[[(r.layer, r.head) in keep for r in rank.itertuples()]]
    missing = keep - {(r.layer, r.head) for r in rank.itertuples()}
    if missing:
        raise ProbeError(f"The importance table has no value for heads {sorted(missing)}.")
    rank = rank.sort_values(["score", "layer", "head"], kind="stable")
    if not isinstance(counts, int):
        chosen = []
        for layer, count in enumerate(counts):
            rows = rank[rank["layer"] == layer].head(count)
            chosen += [(int(a), int(b)) for a, b in zip(rows["layer"], rows["head"], strict=True)]
        return chosen
    left = {layer: len(heads) for layer, heads in enumerate(present)}
    chosen = []
    for r in rank.itertuples():
        if len(chosen) == n_remove:
            break
        if left[r.layer] > min_heads_per_layer:
            chosen.append((int(r.layer), int(r.head)))
            left[r.layer] -= 1
    return chosen


def quota(present: list[tuple[int, ...]], fraction: float, scope: Scope | str) -> int | list[int]:
    """How many heads a fraction means: one global count, or one count per site."""
    scope = choice(Scope, scope, "pruning scope")
    if scope == Scope.LAYER:
        return [n_to_remove(fraction, len(h)) for h in present]
    return n_to_remove(fraction, sum(len(h) for h in present))


def _minus(counts: int | list[int], done: int | list[int]) -> int | list[int]:
    if isinstance(counts, int):
        return counts - done
    return [a - b for a, b in zip(counts, done, strict=True)]


def select_heads(
    model: Transformer,
    batches: Sequence[Batch],
    fraction: float,
    *,
    method: str = "gradient",
    iterative: bool = False,
    step: float = 0.1,
    scope: Scope | str = Scope.GLOBAL,
    min_heads_per_layer: int = 0,
    normalize: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    max_batch_tokens: int | None = None,
) -> pd.DataFrame:
    """Which heads to prune: columns step, layer, head, method, value (importance when chosen).
    Importance runs in micro-batches of `max_batch_tokens` tokens (`head_importance`).

    One-shot ranks once. Iterative removes `step` of the heads at a time (per layer for layer
    scope) and re-estimates importance on the masked model before each step. The fraction is
    of the heads present now. The model's gates are left as they were.
    """
    present = present_heads(model)
    target = quota(present, fraction, scope)
    if iterative and not 0.0 < step <= 1.0:
        raise ProbeError(f"The iterative step must be a fraction in (0, 1], got {step}.")
    per_step = quota(present, step, scope) if iterative else target
    per_step = max(per_step, 1) if isinstance(per_step, int) else [max(c, 1) for c in per_step]
    check_counts(present, target, min_heads_per_layer)
    n_steps = 1
    if iterative:
        pairs = zip(_as_list(target), _as_list(per_step), strict=True)
        n_steps = max(math.ceil(t / p) for t, p in pairs)
    removed: list[dict] = []
    left = target
    before = [g.detach().clone() for g in model.gates()]
    try:
        for i in range(n_steps):
            if _total(left) == 0:
                break
            now = _smaller(per_step, left) if iterative else left
            table = head_importance(
                model,
                batches,
                method,
                normalize=normalize,
                seed=seed + i,
                progress=None if iterative else progress,
                max_batch_tokens=max_batch_tokens,
            )
            chosen = plan_removal(
                table, present_heads(model), now, min_heads_per_layer=min_heads_per_layer
            )
            values = table.set_index(["layer", "head"])["value"]
            removed += [
                {"step": i, "layer": a, "head": b, "method": str(method), "value": values[(a, b)]}
                for a, b in chosen
            ]
            model.set_gates(head_mask(model, chosen))
            left = _minus(left, now)
            if iterative and progress is not None:
                progress(i + 1, n_steps)
    finally:
        model.set_gates(before)
    return pd.DataFrame(removed, columns=["step", "layer", "head", "method", "value"])


def _total(counts: int | list[int]) -> int:
    return counts if isinstance(counts, int) else sum(counts)


def _as_list(counts: int | list[int]) -> list[int]:
    return [counts] if isinstance(counts, int) else list(counts)


def _smaller(a: int | list[int], b: int | list[int]) -> int | list[int]:
    if isinstance(a, int):
        return min(a, b)
    return [min(x, y) for x, y in zip(a, b, strict=True)]


@dataclass
class PruneResult:
    model: Transformer  # the physically pruned model
    removed: pd.DataFrame  # step, layer, head, method, value


def prune_model(
    model: Transformer, batches: Sequence[Batch], fraction: float, **kwargs
) -> PruneResult:
    """`select_heads` on `batches`, then `prune_heads`; the input model is left unchanged."""
    removed = select_heads(model, batches, fraction, **kwargs)
    heads = list(zip(removed["layer"], removed["head"], strict=True))
    return PruneResult(prune_heads(model, heads), removed)
