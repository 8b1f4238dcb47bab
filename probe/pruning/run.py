"""Pruning a checkpoint as `probe prune` does, in one call: `prune` removes heads for real and
compares the models, `sweep` draws the pruning curve. Each decision the command used to make on
its own is made here, so that a Python caller gets what `probe prune` gets:

- the data (`Data`): a model trained here is ranked and scored on its task, at every length it
  was trained on unless lengths are given (`task_lengths`); an imported one on rows of
  `max_tokens` tokens of text (the shipped corpus unless a file is given), by its own objective;
- the sweep runs the random baseline beside the methods asked for (`with_baseline`), and on an
  imported model only the fractions 0, 0.1, ..., 0.9 (`IMPORTED_FRACTIONS`: every head count
  would be hundreds of points);
- the side-by-side timing (`Timing`): an imported model's forward pass is slow, so it times at
  most 3 repeats at batch sizes 1 and 8 (a trained one at most 10 at 1, 16 and 64); unless
  repeats or a budget in seconds are given it may take `TIMING_SHARE` of the time the pruning
  itself took, so a large model's run is not mostly stopwatch;
- an imported model is pruned in place (its weights held once), a trained one beside a copy
  unless that would not fit; mask tuning always prunes a copy (`in_place_for`);
- the pruned checkpoint's meta gains a record of the run (`PruneResult.record`), a pruned
  imported model keeps its tokenizer and the tables go beside it (`PruneResult.save`).

    result = prune(load_checkpoint("runs/copy"), 0.5, method="ablation")
    result.save("runs/copy-pruned")

Importing this module does not import torch (what needs it imports it inside): the command
line reads the defaults and checks the names (`check_options`, `sweep_methods`) before it loads
a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from probe.errors import ProbeError
from probe.fields import choice
from probe.measure.batching import DEFAULT_BATCH_TOKENS
from probe.pruning.choices import CURVE_EXTRAS, Scope, Unit, estimator, parse_methods

if TYPE_CHECKING:
    import pandas as pd

    from probe.checkpoint import Checkpoint
    from probe.data.tasks import Batch
    from probe.pruning.compare import PruneComparison

Phase = Callable[[str, int, int], None]  # (phase, done, total)
Progress = Callable[[int, int], None]  # (done, total)

BASELINE = "random"  # the estimator every sweep is read against
IMPORTED_FRACTIONS = tuple(i / 10 for i in range(10))  # an imported model's sweep: 0, 0.1, ..., 0.9
TIMING_SHARE = 0.25  # the timing's default budget: this share of what the pruning itself took
PRUNED_FILES = ("removed_heads.csv", "prune_metrics.csv", "prune_timing.csv")  # beside the model


def check_options(method: str, scope: str, unit: str, uniform: bool = False,
                  tune: bool = False) -> None:  # fmt: skip
    """Refuse an unknown estimator, scope or unit (with unit "layer" whole sub-layers rank by
    their own score: the estimator is not used), and mask tuning with other than single heads."""
    if choice(Unit, unit, "pruning unit") != Unit.LAYER and estimator(method) is None:
        parse_methods([method])  # an unknown name: one line with a suggestion and the choices
        raise ProbeError(f"Pruning ranks the heads by one importance method, got '{method}'.")
    choice(Scope, scope, "pruning scope")
    if tune and (unit != Unit.HEAD or uniform):
        raise ProbeError("--tune works with --unit head without --uniform.")


def sweep_methods(spec: str | Sequence[str]) -> list[str]:
    """The methods of a sweep from "gradient,fisher+tune" or a list: estimators (checked by name,
    "all" for every one) first, then the curve's own methods (`CURVE_EXTRAS`)."""
    wanted = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec)]
    wanted = [m for m in wanted if m]
    extras = [m for m in wanted if m in CURVE_EXTRAS]
    rest = [m for m in wanted if m not in CURVE_EXTRAS]
    return (parse_methods(rest) if rest else []) + extras


def with_baseline(methods: Sequence[str]) -> list[str]:
    """`methods` with the random baseline (`BASELINE`) added last where they leave it out."""
    return [*methods] if BASELINE in methods else [*methods, BASELINE]


def task_lengths(ckpt: Checkpoint, lengths: Sequence[int] | None = None) -> list[int]:
    """The task lengths a model trained here is ranked and scored at: `lengths`, checked
    against its task and positions, or (None) every length it was trained on. An imported model
    reads text, not lengths: []."""
    if ckpt.imported:
        if lengths:
            raise ProbeError(
                f"{ckpt.path} is an imported model: it reads text (Data.text, Data.max_tokens), "
                "not task lengths; leave lengths out."
            )
        return []
    from probe.measure.evaluate import check_lengths

    lo, hi = ckpt.train_cfg.train_len
    chosen = list(lengths) if lengths else list(range(lo, hi + 1))
    check_lengths(ckpt.model, ckpt.task, chosen)
    return chosen


@dataclass(frozen=True)
class Data:
    """What the heads are ranked and scored on (`probe.pruning.splits.checkpoint_splits`)."""

    lengths: Sequence[int] | None = None  # task lengths (None: those trained on); not imported
    text: Path | None = None  # imported: UTF-8 text, a document a line (None: the shipped corpus)
    whole: bool = False  # imported: read `text` as one document
    max_tokens: int = 128  # imported: tokens per row of text
    batch_size: int = 64  # rows per batch
    batches: int = 1  # batches per length in each split

    def lengths_for(self, ckpt: Checkpoint) -> list[int]:
        return task_lengths(ckpt, self.lengths)

    def text_record(self, ckpt: Checkpoint) -> dict:
        """What a manifest says of an imported model's text (nothing for a trained model)."""
        if not ckpt.imported:
            return {}
        return {"text": str(self.text) if self.text else "shipped corpus", "whole": self.whole,
                "max_tokens": self.max_tokens}  # fmt: skip

    def record(self, ckpt: Checkpoint) -> dict:
        """What a manifest says of the data: lengths, batch size, batches and the text."""
        return {"lengths": self.lengths_for(ckpt), "batch_size": self.batch_size,
                "batches": self.batches, **self.text_record(ckpt)}  # fmt: skip

    def splits(self, ckpt: Checkpoint, n: int, seed: int, max_batch_tokens: int | None
               ) -> tuple[list[list[Batch]], list[Batch]]:  # fmt: skip
        """`n` importance splits and a scoring split, disjoint; drawn with `seed`."""
        from probe.pruning.splits import checkpoint_splits

        return checkpoint_splits(ckpt, self.lengths_for(ckpt), self.batch_size, self.batches,
                                 seed, n, text=self.text, whole=self.whole,
                                 max_tokens=self.max_tokens,
                                 max_batch_tokens=max_batch_tokens)  # fmt: skip


@dataclass(frozen=True)
class Timing:
    """The side-by-side timing of the original, masked and pruned models (`time_forward`)."""

    repeats: int | None = None  # timed repeats per batch size (None: at most 10, imported 3)
    sizes: Sequence[int] | None = None  # batch sizes timed (None: 1, 16, 64; imported 1, 8)
    budget: float | None = None  # seconds the timing may take (None: see `share`)
    share: float = TIMING_SHARE  # without repeats or a budget: the budget is this share of
    # the seconds choosing, pruning and scoring took, and larger sizes that would not fit go
    threads: int | None = 1  # CPU threads while timing (1: stable on a shared CPU)

    def repeats_for(self, imported: bool) -> int:
        return self.repeats if self.repeats is not None else (3 if imported else 10)

    def sizes_for(self, imported: bool) -> list[int]:
        return list(self.sizes or ((1, 8) if imported else (1, 16, 64)))

    @property
    def budget_share(self) -> float | None:
        """The share of the pruning's time the timing may take (None: repeats or a budget given)."""
        return self.share if self.budget is None and self.repeats is None else None


def in_place_for(ckpt: Checkpoint, tune: bool) -> bool | None:
    """Whether `prune` prunes the checkpoint's own model: an imported model yes (memory: its
    weights once), mask tuning no (it prunes a copy), a trained model when a pruned copy would
    not fit beside it (None: `prune_and_compare` decides)."""
    return False if tune else (True if ckpt.imported else None)


@dataclass
class PruneResult:
    """A `prune` run: what `prune_and_compare` found, and the record the pruned model keeps."""

    checkpoint: Checkpoint  # the one pruned (its model is the pruned one when pruned in place)
    comparison: PruneComparison  # the pruned model, the heads removed, metrics, timing
    record: dict  # what the pruned checkpoint's meta["pruning"] gains

    @property
    def meta(self) -> dict:
        """The pruned checkpoint's meta: the original's, with this run's record appended."""
        meta = self.checkpoint.meta
        return {**meta, "pruning": [*meta.get("pruning", []), self.record]}

    def save(self, out: Path | str) -> Path:
        """Write the pruned checkpoint into `out` (an imported model with its tokenizer) and,
        beside it, removed_heads.csv, prune_metrics.csv and prune_timing.csv (when timed)."""
        from probe.checkpoint import save_checkpoint
        from probe.checkpoint_files import TOKENIZER
        from probe.files import atomic_write_text

        ckpt, found, out = self.checkpoint, self.comparison, Path(out)
        tokenizer = (
            ckpt.tokenizer() if ckpt.imported and (ckpt.path / TOKENIZER).is_file() else None
        )
        save_checkpoint(out, found.model, ckpt.task, ckpt.train_cfg, meta=self.meta,
                        source=ckpt.source, tokenizer=tokenizer)  # fmt: skip
        tables = dict(zip(PRUNED_FILES, (found.removed, found.metrics, found.timing), strict=True))
        for name, table in tables.items():
            if name != "prune_timing.csv" or not table.empty:
                atomic_write_text(out / name, table.to_csv(index=False))
        return out


def prune(
    ckpt: Checkpoint,
    fraction: float = 0.5,
    *,
    method: str = "gradient",
    iterative: bool = False,
    step: float = 0.1,
    scope: str = "global",
    min_heads_per_layer: int = 0,
    normalize: bool = False,
    unit: str = "head",
    uniform: bool = False,
    tune: bool = False,
    data: Data = Data(),
    seed: int = 0,
    max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    timing: Timing | None = Timing(),
    progress: Phase | None = None,
) -> PruneResult:
    """Remove `fraction` of the heads of `ckpt`'s model for real, ranked by `method` on an
    importance split of `data`, and compare original, masked and pruned models on a disjoint
    scoring split (`prune_and_compare`; the selection keywords as `select_heads`, whole key/value
    groups or attention sub-layers by `unit`, the same count per group with `uniform`, Fisher mask
    tuning with `tune`). `timing` None: no timing. The policies are the module docstring's."""
    from probe.provenance import device_name
    from probe.pruning.compare import prune_and_compare
    from probe.runtime import Runtime

    check_options(method, scope, unit, uniform, tune)
    select = {"iterative": iterative, "scope": scope, "min_heads_per_layer": min_heads_per_layer,
              "normalize": normalize}  # fmt: skip
    if unit != Unit.HEAD or uniform:
        select = {**select, "unit": unit, "uniform": uniform}
    if tune:
        select = {**select, "tune": True}
    (split,), scoring = data.splits(ckpt, 1, seed, max_batch_tokens)
    times = timing or Timing()
    found = prune_and_compare(
        ckpt.model, split, scoring, fraction, timing=timing is not None,
        repeats=times.repeats_for(ckpt.imported), batch_sizes=times.sizes_for(ckpt.imported),
        threads=times.threads, timing_budget=times.budget, timing_share=times.budget_share,
        max_batch_tokens=max_batch_tokens, in_place=in_place_for(ckpt, tune), progress=progress,
        method=method, step=step, seed=seed, **select,
    )  # fmt: skip
    record = {
        "source": str(ckpt.path), "method": method, "fraction": fraction, "step": step,
        **select, "removed": found.removed[["layer", "head"]].values.tolist(),
        "kept": [list(s.kept_heads) for s in found.model.cfg.sites()],
        "metrics": found.metrics.to_dict("records"), "max_batch_tokens": max_batch_tokens,
        "timing_budget": found.timing_budget, "in_place": found.in_place,
        "device": device_name(next(ckpt.model.parameters()).device),
        "runtime": Runtime.cpu().record(ckpt.model),
    }  # fmt: skip
    return PruneResult(ckpt, found, record)


@dataclass
class SweepResult:
    """A `sweep` run: the curve and what its manifest records."""

    curve: pd.DataFrame  # `probe.schema.CURVE_COLUMNS`: fraction, method, seed, metric, ...
    metric: str  # the primary metric the model is read by (`probe.pruning.objectives`)
    methods: list[str]  # the methods run, the random baseline among them
    settings: dict  # the settings `probe prune --sweep` writes in its manifest.json


def sweep(
    ckpt: Checkpoint,
    methods: str | Sequence[str] = "gradient,ablation,random",
    *,
    seeds: int = 3,
    fractions: Sequence[float] | None = None,
    unit: str = "head",
    data: Data = Data(),
    iterative: bool = False,
    scope: str = "global",
    min_heads_per_layer: int = 0,
    normalize: bool = False,
    seed: int = 0,
    max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    progress: Progress | None = None,
) -> SweepResult:
    """The pruning curve of `ckpt`'s model (`pruning_curve`): each of `methods` (`sweep_methods`,
    the random baseline added) ranks the heads on `seeds` importance splits of `data` (seed r
    draws split r and seeds the random ranking), scored on a disjoint split at each of
    `fractions` (None: every head count; an imported model `IMPORTED_FRACTIONS`), by head or
    with `unit` "group" by key/value group. The policies are the module docstring's."""
    from probe.pruning.curves import primary_metric, pruning_curve

    names = with_baseline(sweep_methods(methods))
    if seeds < 1:
        raise ProbeError(f"A sweep needs seeds >= 1, got {seeds}.")
    if choice(Unit, unit, "pruning unit") == Unit.LAYER:
        raise ProbeError(
            "A sweep prunes by head or by key/value group (unit 'group'); for whole attention "
            "sub-layers add the method attention-layer."
        )
    choice(Scope, scope, "pruning scope")
    select = {"iterative": iterative, "scope": scope, "min_heads_per_layer": min_heads_per_layer,
              "normalize": normalize, "unit": unit}  # fmt: skip
    sets, scoring = data.splits(ckpt, seeds, seed, max_batch_tokens)
    if fractions is None and ckpt.imported:
        fractions = IMPORTED_FRACTIONS
    curve = pruning_curve(ckpt.model, sets, scoring, names, fractions, progress=progress,
                          max_batch_tokens=max_batch_tokens, **select)  # fmt: skip
    settings = {"methods": names, "seeds": seeds, "max_batch_tokens": max_batch_tokens,
                "seed": seed, **select, **data.record(ckpt)}  # fmt: skip
    return SweepResult(curve, primary_metric(scoring), names, settings)
