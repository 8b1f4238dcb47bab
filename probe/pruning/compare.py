"""What `probe prune` runs for one fraction: heads picked on an importance split and removed
physically, the original, masked and pruned models scored side by side on a disjoint split,
their parameters counted and their forward passes timed (within a budget). A model too large
for a pruned copy beside it is pruned in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.measure.batching import split_batch
from probe.measure.evaluate import features_batch
from probe.measure.loss import LOSS_CHUNK
from probe.measure.memory import model_bytes, room_for
from probe.model import Transformer
from probe.pruning.curves import score_batches
from probe.pruning.fisher import fisher_prune
from probe.pruning.groups import select_units
from probe.pruning.heads import (
    head_mask,
    prune_heads,
    select_heads,
)
from probe.pruning.timing import COLUMNS as TIMING_COLUMNS
from probe.pruning.timing import Gated, time_forward, timing_batches

Phase = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class PruneComparison:
    model: Transformer  # the physically pruned model
    removed: pd.DataFrame  # step, layer, head, method, value
    metrics: pd.DataFrame  # variant (original, masked, pruned), metric, value
    parameters: pd.DataFrame  # variant, part (attention, cross-attention, ..., total), count
    timing: pd.DataFrame  # variant, batch_size, part, seconds, ... (empty without timing)
    max_logit_gap: float  # max |pruned logits - masked logits| on the first scoring micro-batch
    work_seconds: float = 0.0  # what choosing, pruning and scoring took
    timing_budget: float | None = None  # seconds the timing was given (None: no budget)
    timing_seconds: float = 0.0  # what the timing took
    in_place: bool = False  # the input model was pruned in place (no copy fitted beside it)


def parameter_table(variants: dict[str, Transformer]) -> pd.DataFrame:
    rows = [
        {"variant": name, "part": part, "count": count}
        for name, model in variants.items()
        for part, count in model.parameter_counts().items()
    ]
    return pd.DataFrame(rows, columns=["variant", "part", "count"])


def _fisher_options(select: dict) -> dict:
    """Mask tuning runs on the Fisher ranking, one shot, global budget: anything else is refused."""
    if select.get("method", "fisher") != "fisher":
        raise ProbeError("--tune tunes the mask Fisher search chose; use it with --method fisher.")
    for key, default in (("iterative", False), ("scope", "global"), ("min_heads_per_layer", 0),
                         ("normalize", False)):  # fmt: skip
        if select.get(key, default) != default:
            flag = "--" + key.replace("_", "-")
            raise ProbeError(f"--tune does not combine with {flag}; drop one of them.")
    return {}


def prune_and_compare(
    model: Transformer,
    importance: Sequence[Batch],
    scoring: Sequence[Batch],
    fraction: float,
    *,
    timing: bool = True,
    batch_sizes: Sequence[int] = (1, 16, 64),
    repeats: int = 10,
    threads: int | None = None,
    timing_budget: float | None = None,
    timing_share: float | None = None,
    max_batch_tokens: int | None = None,
    in_place: bool | None = False,
    progress: Phase | None = None,
    **select,
) -> PruneComparison:
    """Prune `fraction` of the heads chosen on `importance` (keywords as `select_heads`), then
    score original, masked and pruned models on `scoring` and time their forward passes on the
    longest scoring batch. The masked model is the input model run with the removed heads'
    gates at 0 (`Gated`), not a copy of its weights.

    The input model is left unchanged, unless `in_place` (None: when a pruned copy would not
    fit beside it, `probe.measure.memory.room_for`): then it is scored and timed first, pruned in
    place (it becomes the result's model: no second copy of the weights), and the pruned model
    scored and timed after it, not interleaved with it. Mask tuning (`tune`) prunes a copy.

    Every pass holds at most `max_batch_tokens` tokens (micro-batches). The timing takes at
    most `timing_budget` seconds, or `timing_share` times what choosing, pruning and scoring
    took (neither: `repeats` exactly at every size; `time_forward`)."""
    started = time.perf_counter()

    def phase(name: str):
        return None if progress is None else (lambda done, total: progress(name, done, total))

    unit, uniform = select.pop("unit", "head"), select.pop("uniform", False)
    tune = select.pop("tune", False)
    budget = max_batch_tokens
    before = [g.detach().clone() for g in model.gates()]
    pruned = None
    if tune:  # Fisher mask search + mask tuning: the masked model runs with the tuned scales
        if in_place:
            raise ProbeError("Mask tuning prunes a copy of the model; it cannot prune in place.")
        result = fisher_prune(model, importance, fraction, progress=phase("importance"),
                              max_batch_tokens=budget, **_fisher_options(select))  # fmt: skip
        removed, pruned = result.removed, result.model
        gates = [s.to(g.dtype) for s, g in zip(result.scales, before, strict=True)]
        in_place = False
    else:
        if str(unit) != "head" or uniform:
            removed = select_units(model, importance, fraction, unit=unit, uniform=uniform,
                                   progress=phase("importance"), max_batch_tokens=budget,
                                   **select)  # fmt: skip
        else:
            removed = select_heads(model, importance, fraction, progress=phase("importance"),
                                   max_batch_tokens=budget, **select)  # fmt: skip
        heads = list(zip(removed["layer"], removed["head"], strict=True))
        gates = head_mask(model, heads)
        if in_place is None:
            in_place = not room_for(model_bytes(model))
        if not in_place:
            pruned = prune_heads(model, heads)
    masked = Gated(model, gates)
    first = split_batch(scoring[0], budget)[0].to(next(model.parameters()).device)
    originals = parameter_table({"original": model})
    rows = []

    def scored(name: str, runner: Transformer, gates: list[torch.Tensor] | None = None) -> None:
        if gates is not None:
            runner.set_gates(gates)
        metrics = score_batches(runner, scoring, budget)
        rows.extend({"variant": name, "metric": k, "value": v} for k, v in metrics.items())
        if progress is not None:
            progress("scoring", len({r["variant"] for r in rows}), 3)

    try:
        masked_features = _features(masked, first)  # [token, d_model]
        scored("original", model, before)
        scored("masked", model, gates)
    finally:
        model.set_gates(before)
    tables = []
    share = None
    if timing:
        longest = max(scoring, key=lambda b: b.inputs.shape[1])
        sizes = timing_batches(longest, batch_sizes)
    timed = 0.0
    if in_place:  # time the original now: it is about to become the pruned model
        if timing:
            work = time.perf_counter() - started
            share = timing_budget if timing_budget is not None else (
                None if timing_share is None else timing_share * work)  # fmt: skip
            t0 = time.perf_counter()
            two = None if share is None else share * 2 / 3  # two variants of the three
            tables.append(time_forward({"original": model, "masked": masked}, sizes,
                                       repeats=repeats, threads=threads,
                                       progress=phase("timing"), budget=two))  # fmt: skip
            timed += time.perf_counter() - t0
        pruned = prune_heads(model, heads, in_place=True)
    gap = _max_logit_gap(masked_features, pruned, first)
    scored("pruned", pruned)
    work = time.perf_counter() - started - timed
    if timing_budget is None and timing_share is not None:
        timing_budget = timing_share * work
    t0 = time.perf_counter()
    if timing and in_place:
        tables.append(time_forward({"pruned": pruned}, sizes, repeats=repeats, threads=threads,
                                   progress=phase("timing"),
                                   budget=None if share is None else share / 3))  # fmt: skip
        timing_budget = share
    elif timing:
        variants = {"original": model, "masked": masked, "pruned": pruned}
        tables.append(time_forward(variants, sizes, repeats=repeats, threads=threads,
                                   progress=phase("timing"), budget=timing_budget))  # fmt: skip
    timed += time.perf_counter() - t0
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=TIMING_COLUMNS)
    return PruneComparison(
        model=pruned,
        removed=removed,
        metrics=pd.DataFrame(rows, columns=["variant", "metric", "value"]),
        parameters=pd.concat([originals, parameter_table({"pruned": pruned})], ignore_index=True),
        timing=table,
        max_logit_gap=gap,
        work_seconds=work,
        timing_budget=timing_budget if timing else None,
        timing_seconds=timed,
        in_place=bool(in_place),
    )


@torch.no_grad()
def _features(masked: Gated, batch: Batch) -> torch.Tensor:
    """The masked model's last hidden states on `batch`: [token, d_model]."""
    masked.model.set_gates(masked.gates)
    return features_batch(masked.model, batch).flatten(0, 1)


@torch.no_grad()
def _max_logit_gap(masked: torch.Tensor, pruned: Transformer, batch: Batch) -> float:
    """max |masked logits - pruned logits| over `batch` (the first scoring micro-batch), given
    the masked model's hidden states there; the vocabulary projection (which pruning leaves
    alone) LOSS_CHUNK logits at a time."""
    b = features_batch(pruned, batch).flatten(0, 1)  # [token, d_model]
    per = max(1, LOSS_CHUNK // pruned.cfg.vocab_size)
    gap = 0.0
    for start in range(0, b.shape[0], per):
        rows = slice(start, start + per)
        diff = pruned.logits(masked[rows]).float() - pruned.logits(b[rows]).float()
        gap = max(gap, float(diff.abs().max()))
    return gap
