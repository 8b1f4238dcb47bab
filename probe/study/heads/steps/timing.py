"""The timing step, planned once the curves are known: it times, on one thread, the physically
pruned model of every curve method at the study's fixed fractions and at the method's operating
point (the most heads removed with the primary metric still within the tolerance, in every
seed), each beside the original; the report's section on how much faster they run, and the
[timing] section of the study file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from probe.errors import ProbeError
from probe.options import option
from probe.study.heads.step import Later, Options, Section, StepKind, StudySection
from probe.study.heads.steps.curves import increasing
from probe.study.heads.study import HeadStudy
from probe.words import counted

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject


def _cpus() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class TimingOptions:
    # pruned models timed at these fractions (and the operating point of every curve method)
    fractions: tuple[float, ...] = ()
    batch_sizes: tuple[int, ...] = option((1, 8), low=1, help="rows per timed batch")
    repeats: int = option(3, low=1, help="timed repeats")
    threads: int = option(1, low=1, high=_cpus,
                          help="torch threads, at most this machine's CPU count")  # fmt: skip


def _check(study: HeadStudy) -> None:
    fractions = study.timing.fractions
    increasing(study, "timing", fractions)
    for f in fractions:
        if not 0.0 < f < 1.0:
            raise ProbeError(
                f"{study.where} [timing] fractions must lie strictly between 0 and 1 (a model "
                f"with none or all of its heads removed is not timed), got {f}."
            )


TIMING = StudySection("timing", 70, TimingOptions, check=_check)


def pruned_model(subject: Subject, method: str, unit: str, n_pruned: int,
                 tables: dict[str, pd.DataFrame] | None = None):  # fmt: skip
    """The physically pruned model of one curve method, unit and head count (seed 0's data).
    `tables`: importance already computed on seed 0's data, by method ("attention-layer": the
    layer table), reused instead of computed again."""
    from probe.pruning.fisher import fisher_prune
    from probe.pruning.groups import plan_units
    from probe.pruning.heads import plan_removal, present_heads, prune_heads, quota
    from probe.pruning.importance import head_importance
    from probe.pruning.layer_drop import layer_importance, plan_layers

    model = subject.model
    split = subject.splits[0][0]
    present = present_heads(model)
    fraction = n_pruned / sum(len(h) for h in present)
    known = tables or {}
    if method == "fisher+tune":
        return fisher_prune(model, split, fraction, table=known.get("fisher")).model
    if method == "attention-layer":
        layers = known.get(method)
        layers = layer_importance(model, split) if layers is None else layers
        plan = plan_layers(layers, model, fraction)
    else:
        table = known.get(method)
        table = head_importance(model, split, method, seed=0) if table is None else table
        plan = (plan_units(table, model, fraction, "group", uniform=False) if unit == "group"
                else plan_removal(table, present, quota(present, fraction, "global")))  # fmt: skip
    return prune_heads(model, plan)


def times_models(study: HeadStudy) -> bool:
    """Whether a run of `study` ends with the timing step."""
    return bool(study.timing.fractions or study.curves.methods)


def timing_step(study: HeadStudy, curves: pd.DataFrame) -> dict[str, Any] | None:
    """The options of the timing step (None: nothing to time): the pruned models of every curve
    method at the fixed fractions and at its operating point, timed against the original on one
    thread."""
    if curves.empty or not times_models(study):
        return None
    from probe.pruning.objectives import objective_of, operating_points

    t = study.timing
    n_heads = int(curves.n_pruned.max() / max(curves.fraction.max(), 1e-9) + 0.5)
    ops = operating_points(curves, objective_of(curves.metric), study.operating.tolerance)
    wanted: list[tuple[str, str, int, str]] = []
    for (method, unit), g in ops.groupby(["method", "unit"], sort=False):
        counts = {round(f * n_heads): "fixed" for f in t.fractions}
        if g.n_pruned.notna().all():
            counts.setdefault(int(g.n_pruned.min()), "operating point")
        for n, why in sorted(counts.items()):
            if 0 < n < n_heads:
                wanted.append((str(method), str(unit), n, why))
    if not wanted:
        return None
    options = {"variants": wanted, "batch_sizes": list(t.batch_sizes), "repeats": t.repeats,
               "threads": t.threads, "tolerance": study.operating.tolerance}  # fmt: skip
    return options


def seed_zero_tables(importance: pd.DataFrame, layers: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The importance tables of seed 0 by method, and the layer table as "attention-layer"."""
    known = {}
    if not importance.empty:
        first = importance[importance.seed == 0]
        known = {str(m): g.reset_index(drop=True) for m, g in first.groupby("method")}
    if not layers.empty:
        known["attention-layer"] = layers[layers.seed == 0].reset_index(drop=True)
    return known


def _plan_later(study: HeadStudy, tables: dict[str, pd.DataFrame]) -> tuple[Options, dict] | None:
    empty = pd.DataFrame()
    options = timing_step(study, tables.get("curves", empty))
    if options is None:
        return None
    return options, seed_zero_tables(tables.get("importance", empty), tables.get("layers", empty))


def time_variants(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """`given`: seed 0's importance tables by method, so the pruned models need not estimate it
    again."""
    from probe.pruning.timing import time_forward, timing_batches

    wanted, known = [tuple(v) for v in options["variants"]], given
    t = subject.study.timing
    model = subject.model
    scoring = subject.splits[1]
    longest = max(scoring, key=lambda b: b.inputs.shape[1])
    batches = timing_batches(longest, t.batch_sizes)
    tokens = longest.inputs.shape[1]
    rows = []
    for i, (method, unit, n, why) in enumerate(wanted):
        pruned = pruned_model(subject, method, unit, n, known)
        table = time_forward({"original": model, "pruned": pruned}, batches, warmup=1,
                             repeats=t.repeats, threads=t.threads)  # fmt: skip
        params = {"original": model.parameter_counts()["total"],
                  "pruned": pruned.parameter_counts()["total"]}  # fmt: skip
        table = table[table.part == "model"].assign(
            method=method,
            unit=unit,
            n_pruned=n,
            why=why,
            tokens=tokens,
            parameters=table.variant.map(params),
            tokens_per_s=lambda d: d.batch_size * tokens / d.seconds,
        )
        rows.append(table)
        del pruned
        progress(i + 1, len(wanted))
    return pd.concat(rows, ignore_index=True)


def timing_noise(speed: pd.DataFrame) -> dict[int, float]:
    """Per batch size, how much the unpruned model's own speed varied between its timings (one
    beside each pruned copy): max / min - 1 of its tokens/s. One pruned model's ratio closer to 1
    than this is not a measured difference on its own (the sign test over all pruned models of
    one size, each paired with the original timed beside it, is)."""
    spread = speed.groupby("batch_size")["original_tok_s"].agg(lambda x: x.max() / x.min() - 1)
    return {int(b): float(v) for b, v in spread.items()}


def _noise_text(speed: pd.DataFrame) -> str:
    n = int(speed.groupby("batch_size").size().min())
    ranges = ", ".join(f"{v:.0%} at batch {b}" for b, v in timing_noise(speed).items())
    return f"the original's own speed varied by up to {ranges} over its {counted(n, 'timing')}"


def how_much_faster(r: Findings, rep: MarkdownReport) -> None:
    if r.speed.empty:
        return
    from probe.report.pruning_plots import speed_plot

    rep.heading("How much faster")
    rep.paragraph("Each physically pruned model timed side by side with the original, one "
                  "thread; `why` says whether the count is a fixed share or the method's "
                  f"operating point. Timing noise: {_noise_text(r.speed)}; "
                  "one speed-up closer to 1 than that is not a measured difference on its "
                  "own (the sign test below pools them).")  # fmt: skip
    rep.table(r.speed, "speed.csv", data=r.tables["timing"], digits=3)
    rep.figure(speed_plot(r.tables["timing"]), "speed.png",
               "tokens/s of each pruned model over the original's")  # fmt: skip
    rep.paragraph("By number of heads removed, over every method and batch size: how many "
                  "pruned copies ran faster than the original timed beside them, and an "
                  "exact two-sided sign test (small p: a real change in speed).")  # fmt: skip
    shown = r.signs.assign(p_sign=r.signs["p_sign"].map(lambda p: f"{p:.2g}"))
    rep.table(shown, "speed_signs.csv", data=r.signs, digits=3)


DECLARES = StepKind("timing", 7, time_variants, later=Later(_plan_later, times_models),
                    section=TIMING, reports=(Section("timing", 40, how_much_faster),))  # fmt: skip
