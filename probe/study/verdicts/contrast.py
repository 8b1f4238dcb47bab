"""Contrasts: a claim that one arm beats another, tested over seeds (the study's verdicts).

[[contrast]]
claim = "1/sqrt(d_k) trains better than no scaling"   # the sentence the verdict is about
table = "eval"                   # a table the study writes
metric = "exact_match"           # a row of its metric/statistic column
where = { length = "<= L" }      # filters, as in [[expect]]
baseline = { length = 2 }        # optional: each seed's number minus that of these rows (a
                                 # change, e.g. of entropy from L to 4L, within each model)
a = "sqrt"                       # the arm the claim is about (an arm or variant name)
b = "none"                       # the arm it is compared with
column = "arm"                   # the column a and b are values of (e.g. "method" to compare
                                 # two estimators within the same models)
expect = "higher"                # higher | lower (a's value than b's) | similar
per = ["task"]                   # one test per group (default: one over all rows)
within = "mean"                  # how a seed's matching rows become one number: mean, std, max
fitted = false                   # true: compare only arms that fit their training lengths
                                 # (exact match >= 0.95 there); otherwise "not compared"
reference = "vaswani2017-scaling"  # optional: the entry of probe/references.toml it tests
paired = ["seed"]                # optional: the columns whose values match a row of a with its
                                 # row of b (both sides measured on the same seeds' prompts)

Each seed of each arm gives one number (the mean, or the spread, of its matching rows); the
two arms' seeds are compared with an exact one-sided Mann-Whitney test. The verdict is
"supported" when p <= ALPHA in the claimed direction, "contradicted" when p <= ALPHA the other
way, and otherwise "not shown" with the smallest p the number of seeds allows (3 against 3 seeds
cannot go below 0.05). For "similar" no test can show equality: the verdict reports whether the
exact two-sided Mann-Whitney test detects a difference (p_two <= ALPHA; 3 against 3 seeds cannot
go below 0.1).

With `paired`, each unit (a value of the paired columns, within each `per` group) gives one
number per side, reduced as a seed's is, and the test is the exact sign-flip permutation test
of the differences a - b (`stats.sign_flip`; pairs with no difference drop out, as in Wilcoxon's
signed-rank test). Its smallest one-sided p with n differing pairs is 2^-n: 3 pairs cannot go
below 0.125, 5 reach 0.031. A unit one side lacks is dropped, and the verdict row says how many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from probe.errors import ProbeError
from probe.fields import check_keys
from probe.references import published
from probe.significance import ALPHA
from probe.study.verdicts import summary
from probe.study.verdicts.expect import Condition, parse_conditions, select_rows
from probe.study.verdicts.stats import (
    MOST_FLIPPED,
    differences,
    fmt_vs,
    mann_whitney,
    mean_ci,
    sign_flip,
    smallest_flip_p,
    smallest_p,
)
from probe.words import counted, did_you_mean

KEYS = ("claim", "table", "metric", "baseline", "where", "a", "b", "column", "expect", "per",
        "within", "fitted", "reference", "paired")  # fmt: skip
EXPECT = ("higher", "lower", "similar")
WITHIN = ("mean", "std", "max")
FIT_AT = summary.FIT - summary.FIT_TOLERANCE  # what an arm's fit is compared with
WITHIN_NOTE = {"mean": "", "std": " (spread over rows)", "max": " (largest over rows)"}


@dataclass(frozen=True)
class Contrast:
    claim: str
    table: str
    metric: str
    a: str
    b: str
    column: str = "arm"
    expect: str = "higher"
    where: tuple[Condition, ...] = ()
    baseline: tuple[Condition, ...] | None = None
    per: tuple[str, ...] = ()
    within: str = "mean"
    fitted: bool = False
    reference: str = ""
    paired: tuple[str, ...] = ()  # the columns matching a's rows with b's; () = seeds unpaired

    @property
    def units(self) -> tuple[str, ...]:
        """The columns whose values make one number per side: the paired ones, else the seed."""
        return self.paired or ("seed",)


def parse_contrast(raw: Any, where: str, tables: tuple[str, ...]) -> Contrast:
    """A contrast from a study file's [[contrast]] table (`tables`: those the study writes)."""
    check_keys(raw, KEYS, where)
    for key in ("claim", "table", "metric", "a", "b"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ProbeError(f"{where} needs '{key}' as a non-empty string "
                             '(for example a = "sqrt", b = "none").')  # fmt: skip
    if raw["table"] not in tables:
        raise ProbeError(f"{where} table '{raw['table']}' is not one the study writes."
                         f"{did_you_mean(raw['table'], tables)} Its tables: "
                         f"{', '.join(tables)}.")  # fmt: skip
    if raw.get("expect", "higher") not in EXPECT:
        raise ProbeError(f"{where} expect must be one of {', '.join(EXPECT)}, "
                         f"got {raw['expect']!r}.")  # fmt: skip
    if raw.get("within", "mean") not in WITHIN:
        raise ProbeError(f"{where} within must be one of {', '.join(WITHIN)}, "
                         f"got {raw['within']!r}.")  # fmt: skip
    per = raw.get("per", [])
    per = [per] if isinstance(per, str) else per
    if not isinstance(per, list) or not all(isinstance(c, str) for c in per):
        raise ProbeError(f"{where} per must be a column name or a list of them, got {per!r}.")
    if "reference" in raw:
        try:
            published(raw["reference"])
        except ProbeError as exc:
            raise ProbeError(f"{where} {exc}") from None
    if not isinstance(raw.get("column", "arm"), str):
        raise ProbeError(f"{where} column must be a column name, got {raw['column']!r}.")
    rest = {k: raw[k] for k in ("claim", "table", "metric", "a", "b", "column") if k in raw}
    baseline = parse_conditions(raw["baseline"], f"{where} baseline") if "baseline" in raw else None
    return Contrast(
        **rest, expect=raw.get("expect", "higher"), per=tuple(per),
        where=parse_conditions(raw.get("where", {}), f"{where} where"), baseline=baseline,
        within=raw.get("within", "mean"), reference=raw.get("reference", ""),
        fitted=_flag(raw.get("fitted", False), f"{where} fitted"),
        paired=_paired(raw, baseline, f"{where} paired"),
    )  # fmt: skip


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProbeError(f"{where} must be true or false, got {value!r}.")
    return value


def _paired(raw: dict[str, Any], baseline: tuple[Condition, ...] | None,
            where: str) -> tuple[str, ...]:  # fmt: skip
    """The `paired` columns: none of them the compared column (a row of a never matches one of
    b there) or a column the baseline fixes (a unit's baseline is that unit's own rows)."""
    if "paired" not in raw:
        return ()
    value = raw["paired"]
    value = [value] if isinstance(value, str) else value
    names = isinstance(value, list) and all(isinstance(c, str) and c for c in value)
    if not names or not value or len(set(value)) < len(value):
        raise ProbeError(f"{where} must be a non-empty list of distinct column names, the "
                         "columns whose values match a row of a with its row of b (for example "
                         f'paired = ["seed"]), got {raw["paired"]!r}.')  # fmt: skip
    column = raw.get("column", "arm")
    if column in value:
        raise ProbeError(f"{where} names '{column}', the column a and b are values of: no row of "
                         "a matches one of b there. Name the columns both sides share, such as "
                         "the seed.")  # fmt: skip
    fixed = [c for c in value if c in {cond.column for cond in baseline or ()}]
    if fixed:
        raise ProbeError(f"{where} names '{fixed[0]}', which baseline fixes: each unit's number "
                         "is a change from its own baseline rows, so pair by the other "
                         "columns.")  # fmt: skip
    return tuple(value)


def unfitted(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Arms whose exact match at the training lengths (mean over seeds and tasks) is below the
    fitting threshold: arm -> that exact match."""
    if "eval" not in tables:
        return {}
    exact = summary.metric_rows(tables["eval"], "exact_match")
    fit = summary.by_arm_task(exact[summary.seen(exact)])
    low = fit[~summary.fitted(fit)]
    return {str(r.arm): float(r.mean) for r in low.itertuples()}


def per_seed(contrast: Contrast, table: pd.DataFrame) -> pd.DataFrame:
    """One number per (group, side, unit): columns per..., side (a's or b's value of the
    contrast's column), the unit's columns (the seed, or the paired columns), value; with a
    baseline, the number minus the baseline rows'."""
    value = _reduced(contrast, table, contrast.where)
    if contrast.baseline is None:
        return value
    base = _reduced(contrast, table, contrast.baseline)
    keys = [*contrast.per, "side", *contrast.units]
    both = value.merge(base, on=keys, suffixes=("", "_baseline"))
    return both.assign(value=both["value"] - both["value_baseline"])[[*keys, "value"]]


def _reduced(contrast: Contrast, table: pd.DataFrame, where: tuple[Condition, ...]):
    needed = list(dict.fromkeys([*contrast.per, contrast.column, *contrast.units]))
    df = select_rows(table, contrast.table, contrast.metric, where, needed,
                     owner=f"contrast '{contrast.claim}': ")  # fmt: skip
    df = df[df[contrast.column].astype(str).isin([contrast.a, contrast.b])]
    df = df.assign(side=df[contrast.column].astype(str))
    keys = [*contrast.per, "side", *contrast.units]
    reduce = {"mean": "mean", "max": "max", "std": lambda v: float(np.std(v, ddof=0))}
    return df.groupby(keys, sort=True)["value"].agg(reduce[contrast.within]).reset_index()


def evaluate(contrast: Contrast, table: pd.DataFrame) -> pd.DataFrame:
    """The verdict per group: columns per..., claim, a, b, metric, mean/low/high of each arm,
    n_a, n_b, p_claim (one-sided in the claimed direction; for "similar", a higher), p_other (the
    other direction), p_two (two-sided), verdict; a paired contrast's also n_pairs, n_differ
    (pairs whose difference is not zero), unmatched (units one side lacks, dropped) and exact
    (False: a Monte-Carlo p)."""
    seeds = per_seed(contrast, table)
    groups = seeds.groupby(list(contrast.per), sort=True) if contrast.per else [((), seeds)]
    rows = []
    for keys, group in groups:
        keys = keys if isinstance(keys, tuple) else (keys,)
        x, y, row = _sides(contrast, group)
        row = {**dict(zip(contrast.per, keys, strict=True)), "claim": contrast.claim,
               "a": contrast.a, "b": contrast.b, "metric": contrast.metric,
               "expect": contrast.expect, "n_a": len(x), "n_b": len(y),
               "change": contrast.baseline is not None, **row}  # fmt: skip
        for arm, values in (("a", x), ("b", y)):
            row[f"mean_{arm}"], row[f"low_{arm}"], row[f"high_{arm}"] = mean_ci(values)
        if len(x) == 0 or len(y) == 0:
            row.update(p_claim=np.nan, p_other=np.nan, p_two=np.nan, verdict="no data")
        else:
            row.update(_tested(contrast, x, y))
        rows.append(row)
    return pd.DataFrame(rows)


def _sides(contrast: Contrast, group: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, dict]:
    """a's and b's numbers in a group (paired: aligned unit by unit, the units only one side has
    dropped) and what the row says about the pairing."""
    # a unit with no number (NaN) is no evidence either way: it drops out, as a missing seed does
    a, b = (group[group["side"] == side].set_index(list(contrast.units))["value"].dropna()
            for side in (contrast.a, contrast.b))  # fmt: skip
    if not contrast.paired:
        return a.to_numpy(float), b.to_numpy(float), {}
    both = a.index.intersection(b.index)
    x, y = a.loc[both].to_numpy(float), b.loc[both].to_numpy(float)
    differ = len(differences(x, y))
    return x, y, {"n_pairs": len(both), "n_differ": differ,
                  "unmatched": len(a) + len(b) - 2 * len(both),
                  "exact": differ <= MOST_FLIPPED}  # fmt: skip


def _tested(contrast: Contrast, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """p_claim, p_other, p_two and the verdict: the sign-flip test of paired values, else the
    Mann-Whitney test."""
    side = "less" if contrast.expect == "lower" else "greater"
    other = "greater" if side == "less" else "less"
    test = sign_flip if contrast.paired else mann_whitney
    p_claim, p_other, p_two = (float(test(x, y, alt)) for alt in (side, other, "two-sided"))
    if contrast.paired:
        k = len(differences(x, y))
        size = counted(len(x), "pair") + ("" if k == len(x) else f" ({k or 'none'} differing)")
        floors = (smallest_flip_p(k), smallest_flip_p(k, two_sided=True))
        verdict = _read(contrast.expect, p_claim, p_other, p_two, floors, size)
    else:
        verdict = _verdict(contrast.expect, p_claim, p_other, len(x), len(y), p_two)
    return {"p_claim": p_claim, "p_other": p_other, "p_two": p_two, "verdict": verdict}


def _verdict(expect: str, p_claim: float, p_other: float, n: int, m: int,
             p_two: float | None = None) -> str:  # fmt: skip
    """The verdict of a Mann-Whitney test of n against m seeds."""
    if p_two is None:
        p_two = min(1.0, 2 * min(p_claim, p_other))
    floors = (smallest_p(n, m), smallest_p(n, m, two_sided=True))
    return _read(expect, p_claim, p_other, p_two, floors, f"{n} against {counted(m, 'seed')}")


def _read(expect: str, p_claim: float, p_other: float, p_two: float,
          floors: tuple[float, float], size: str) -> str:  # fmt: skip
    """The verdict from the three p-values; `floors`: the smallest one- and two-sided p the
    data allow; `size`: what they were ("3 against 3 seeds", "3 pairs")."""
    if expect == "similar":
        if p_two <= ALPHA:
            return "contradicted: a difference was detected"
        if floors[1] > ALPHA:
            return (f"no difference detected: {size} cannot reach a two-sided p <= {ALPHA:g} "
                    "(which does not show equality)")  # fmt: skip
        return "no difference detected (which does not show equality)"
    if p_claim <= ALPHA:
        return "supported"
    if p_other <= ALPHA:
        return "contradicted: the opposite direction"
    if floors[0] > ALPHA:
        return f"not testable: {size} cannot reach p <= {ALPHA:g}"
    return "not shown"


def verdict_table(contrasts: tuple[Contrast, ...], tables: dict[str, pd.DataFrame],
                  where: str = "") -> pd.DataFrame:  # fmt: skip
    """Every contrast's verdicts, one row per contrast and group (absent tables skipped); a
    column or metric a table lacks is one line naming `where` (the study file) and the contrast."""
    misfit = unfitted(tables)
    parts = []
    for i, c in enumerate(contrasts):
        if c.table not in tables:
            continue
        try:
            part = evaluate(c, tables[c.table])
        except ProbeError as exc:
            raise ProbeError(f"{where} [[contrast]] #{i + 1}, {exc}".lstrip(" ,")) from None
        bad = [f"{arm} ({fmt_vs(misfit[arm], FIT_AT)})" for arm in (c.a, c.b) if arm in misfit]
        if c.fitted and bad and not part.empty:
            verb = "does not fit its" if len(bad) == 1 else "do not fit their"
            part = part.assign(verdict=f"not compared: {', '.join(bad)} {verb} training lengths "
                               "(exact match < 0.95)")  # fmt: skip
        parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
