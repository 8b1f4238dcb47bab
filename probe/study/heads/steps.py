"""The steps of a head study, and the operating point they lead to.

Seed r estimates importance on text split r (disjoint from every other split and from the
scoring split) and seeds the random baseline; every curve is scored on the one scoring split.
The timing step comes last: it times, on one thread, the physically pruned model of every curve
method at the study's fixed fractions and at the method's operating point (the most heads
removed with the primary metric still within the tolerance, in every seed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from probe.analysis.retrieval import retrieval_scores
from probe.analysis.roles import head_roles
from probe.pruning.curves import pruning_curve, score_batches
from probe.pruning.fisher import fisher_prune
from probe.pruning.groups import plan_units
from probe.pruning.heads import masked, plan_removal, present_heads, prune_heads, quota
from probe.pruning.importance import head_importance
from probe.pruning.layer_drop import layer_importance, plan_layers
from probe.pruning.objectives import objective_of, operating_points
from probe.pruning.timing import time_forward, timing_batches
from probe.study.heads.spec import HeadStudy

if TYPE_CHECKING:  # the plan's units and context: they call the steps defined here
    from probe.study.heads.plan import HeadStep, Subject

# which retrieval score and which mask tuning the steps compute: in the steps' options, so a
# change of definition recomputes exactly the steps that use it (retrieval, knock-out, and the
# fisher+tune curves)
RETRIEVAL_SCORE = "wu2024-greedy"
MASK_TUNING = "kwon2022-layer-by-layer"


def plan_steps(study: HeadStudy) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, kind, options) of every step but the timing, in the order they run."""
    seeds = range(study.text.seeds)
    steps: list[tuple[str, str, dict[str, Any]]] = [("model", "model", {})]
    for method in study.importance.methods:
        for seed in seeds:
            steps.append((f"importance-{method}-s{seed}", "importance",
                          {"method": method, "seed": seed}))  # fmt: skip
    if "attention-layer" in study.curves.methods:
        steps += [(f"layers-s{seed}", "layers", {"seed": seed}) for seed in seeds]
    by_unit = [("head", m) for m in study.curves.methods]
    by_unit += [("group", m) for m in study.curves.group_methods]
    for unit, method in by_unit:
        for seed in seeds:
            options = {"method": method, "unit": unit, "seed": seed,
                       "fractions": list(study.curves.fractions)}  # fmt: skip
            if method == "fisher+tune":
                options["tune"] = MASK_TUNING
            steps.append((f"curve-{unit}-{method}-s{seed}", "curves", options))
    roles = study.roles
    if roles.enabled:
        steps.append(("roles", "roles", {"period": roles.period}))
    if roles.needles:
        steps.append(("retrieval", "retrieval", {"needles": roles.needles,
                                                 "context": roles.context,
                                                 "score": RETRIEVAL_SCORE}))  # fmt: skip
    ko = study.knockout
    if ko.heads:
        options = {"needles": roles.needles, "context": roles.context, "heads": list(ko.heads),
                   "draws": ko.draws, "prompts": ko.prompts, "score": RETRIEVAL_SCORE}  # fmt: skip
        steps.append(("knockout", "knockout", options))
    return steps


def _importance(subject: Subject, step: HeadStep, progress) -> pd.DataFrame:
    method, seed = step.options["method"], step.options["seed"]
    split = subject.splits[0][seed]
    table = head_importance(subject.model, split, method, seed=seed, progress=progress)
    return table.assign(seed=seed)


def _layers(subject: Subject, step: HeadStep, progress) -> pd.DataFrame:
    seed = step.options["seed"]
    return layer_importance(subject.model, subject.splits[0][seed]).assign(seed=seed)


def _curve(subject: Subject, step: HeadStep, progress) -> pd.DataFrame:
    o = step.options
    sets, scoring = subject.splits
    table = pruning_curve(subject.model, [sets[o["seed"]]], scoring, [o["method"]],
                          list(o["fractions"]), unit=o["unit"], seeds=[o["seed"]],
                          progress=progress)  # fmt: skip
    return table.assign(unit=o["unit"])


def model_facts(subject: Subject, step: HeadStep | None = None, progress=None) -> pd.DataFrame:
    """One row: the model's shape, its parameters, the text it is scored on, and its unpruned
    metrics on the scoring split."""
    model, cfg = subject.model, subject.model.cfg
    sets, scoring = subject.splits
    counts = model.parameter_counts()
    row = {"source": subject.study.source, "model_type": subject.imported.source["model_type"],
           "objective": subject.objective, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
           "n_kv_head": cfg.kv_heads, "d_model": cfg.d_model, "parameters": counts["total"],
           "attention_parameters": counts.get("attention", 0),
           "rows_per_split": sum(b.inputs.shape[0] for b in scoring),
           "tokens_per_row": scoring[0].inputs.shape[1], "importance_splits": len(sets),
           "documents": len(subject.docs)}  # fmt: skip
    row.update(score_batches(model, scoring))
    return pd.DataFrame([row])


def _roles(subject: Subject, step: HeadStep, progress) -> pd.DataFrame:
    return head_roles(subject.model, subject.splits[1], period=step.options["period"], seed=0)


def _retrieval(subject: Subject, step: HeadStep, progress) -> pd.DataFrame:
    return subject.retrieval


def knockout(subject: Subject, step: HeadStep | None, progress) -> pd.DataFrame:
    """Copy accuracy on fresh needle prompts with the top-k retrieval heads (by Wu et al.'s score)
    masked, against k random heads from the rest (`draws` draws), for each k: columns k,
    selection, draw, copy_accuracy (teacher-forced share of needle tokens predicted right),
    recall (the greedy output's needle recall, Wu et al.'s measure of retrieval), heads."""
    ko = subject.study.knockout
    model = subject.model
    scores = subject.retrieval.sort_values(
        ["value", "layer", "head"], ascending=[False, True, True], kind="stable"
    )
    ranked = list(zip(scores.layer.astype(int), scores["head"].astype(int), strict=True))
    prompts = subject.needles(ko.prompts, seed=1)
    runs = [(0, "none", 0, [])]
    for k in ko.heads:
        top = ranked[:k]
        runs.append((k, "retrieval", 0, top))
        rest = ranked[k:]
        for draw in range(ko.draws):
            gen = torch.Generator().manual_seed(draw)
            pick = torch.randperm(len(rest), generator=gen)[:k].tolist()
            runs.append((k, "random", draw, [rest[i] for i in sorted(pick)]))
    rows = []
    for i, (k, selection, draw, heads) in enumerate(runs):
        with masked(model, heads):  # only these heads; the gates come back afterwards
            table = retrieval_scores(model, prompts)
        rows.append({"k": k, "selection": selection, "draw": draw,
                     "copy_accuracy": float(table["copy_accuracy"].iloc[0]),
                     "recall": float(table["recall"].iloc[0]),
                     "heads": " ".join(f"L{a}H{b}" for a, b in heads)})  # fmt: skip
        progress(i + 1, len(runs))
    return pd.DataFrame(rows)


def pruned_model(subject: Subject, method: str, unit: str, n_pruned: int,
                 tables: dict[str, pd.DataFrame] | None = None):  # fmt: skip
    """The physically pruned model of one curve method, unit and head count (seed 0's data).
    `tables`: importance already computed on seed 0's data, by method ("attention-layer": the
    layer table), reused instead of computed again."""
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


def step_count(study: HeadStudy) -> int:
    """How many steps a run of `study` takes."""
    return len(plan_steps(study)) + times_models(study)


def timing_step(study: HeadStudy, curves: pd.DataFrame) -> dict[str, Any] | None:
    """The options of the timing step (None: nothing to time): the pruned models of every curve
    method at the fixed fractions and at its operating point, timed against the original on one
    thread."""
    if curves.empty or not times_models(study):
        return None
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


def _time_variants(subject: Subject, step: HeadStep, progress) -> pd.DataFrame:
    """`step.given`: seed 0's importance tables by method, so the pruned models need not
    estimate it again."""
    wanted, known = [tuple(v) for v in step.options["variants"]], step.given
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


# kind -> the function computing a step of that kind: (subject, step, progress) -> its table
STEPS = {"model": model_facts, "importance": _importance, "layers": _layers, "curves": _curve,
         "roles": _roles, "retrieval": _retrieval, "knockout": knockout,
         "timing": _time_variants}  # fmt: skip
