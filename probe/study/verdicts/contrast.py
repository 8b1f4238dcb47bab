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

Each seed of each arm gives one number (the mean, or the spread, of its matching rows); the
two arms' seeds are compared with an exact one-sided Mann-Whitney test. The verdict is
"supported" when p <= ALPHA in the claimed direction, "contradicted" when p <= ALPHA the other
way, and otherwise "not shown" with the smallest p the number of seeds allows (3 against 3 seeds
cannot go below 0.05). For "similar" no test can show equality: the verdict reports whether the
exact two-sided Mann-Whitney test detects a difference (p_two <= ALPHA; 3 against 3 seeds cannot
go below 0.1).
"""

from __future__ import annotations

import math
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
from probe.study.verdicts.stats import fmt_ci, fmt_vs, mann_whitney, mean_ci
from probe.words import counted, did_you_mean

KEYS = (
    "claim",
    "table",
    "metric",
    "baseline",
    "where",
    "a",
    "b",
    "column",
    "expect",
    "per",
    "within",
    "fitted",
    "reference",
)
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
    return Contrast(
        **rest, expect=raw.get("expect", "higher"), per=tuple(per),
        where=parse_conditions(raw.get("where", {}), f"{where} where"),
        baseline=parse_conditions(raw["baseline"], f"{where} baseline") if "baseline" in raw
        else None,
        within=raw.get("within", "mean"), reference=raw.get("reference", ""),
        fitted=_flag(raw.get("fitted", False), f"{where} fitted"),
    )  # fmt: skip


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProbeError(f"{where} must be true or false, got {value!r}.")
    return value


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
    """One number per (group, side, seed): columns per..., side (a's or b's value of the
    contrast's column), seed, value; with a baseline, the number minus the baseline rows'."""
    value = _reduced(contrast, table, contrast.where)
    if contrast.baseline is None:
        return value
    base = _reduced(contrast, table, contrast.baseline)
    keys = [*contrast.per, "side", "seed"]
    both = value.merge(base, on=keys, suffixes=("", "_baseline"))
    return both.assign(value=both["value"] - both["value_baseline"])[[*keys, "value"]]


def _reduced(contrast: Contrast, table: pd.DataFrame, where: tuple[Condition, ...]):
    needed = [*contrast.per, contrast.column, "seed"]
    df = select_rows(table, contrast.table, contrast.metric, where, needed,
                     owner=f"contrast '{contrast.claim}': ")  # fmt: skip
    df = df[df[contrast.column].astype(str).isin([contrast.a, contrast.b])]
    df = df.assign(side=df[contrast.column].astype(str))
    keys = [*contrast.per, "side", "seed"]
    reduce = {"mean": "mean", "max": "max", "std": lambda v: float(np.std(v, ddof=0))}
    return df.groupby(keys, sort=True)["value"].agg(reduce[contrast.within]).reset_index()


def smallest_p(n: int, m: int, two_sided: bool = False) -> float:
    """The smallest exact Mann-Whitney p with n against m values: 1 / C(n + m, n) one-sided,
    twice that two-sided."""
    return (2 if two_sided else 1) / math.comb(n + m, n)


def evaluate(contrast: Contrast, table: pd.DataFrame) -> pd.DataFrame:
    """The verdict per group: columns per..., claim, a, b, metric, mean/low/high of each arm,
    n_a, n_b, p_claim (one-sided in the claimed direction; for "similar", a higher), p_other (the
    other direction), p_two (two-sided), verdict."""
    seeds = per_seed(contrast, table)
    groups = seeds.groupby(list(contrast.per), sort=True) if contrast.per else [((), seeds)]
    rows = []
    for keys, group in groups:
        keys = keys if isinstance(keys, tuple) else (keys,)
        x = group.loc[group["side"] == contrast.a, "value"].to_numpy(float)
        y = group.loc[group["side"] == contrast.b, "value"].to_numpy(float)
        row = {**dict(zip(contrast.per, keys, strict=True)), "claim": contrast.claim,
               "a": contrast.a, "b": contrast.b, "metric": contrast.metric,
               "expect": contrast.expect, "n_a": len(x), "n_b": len(y),
               "change": contrast.baseline is not None}  # fmt: skip
        for arm, values in (("a", x), ("b", y)):
            row[f"mean_{arm}"], row[f"low_{arm}"], row[f"high_{arm}"] = mean_ci(values)
        if len(x) == 0 or len(y) == 0:
            row.update(p_claim=np.nan, p_other=np.nan, p_two=np.nan, verdict="no data")
            rows.append(row)
            continue
        side = "less" if contrast.expect == "lower" else "greater"
        other = "greater" if side == "less" else "less"
        p_claim = mann_whitney(x, y, side)
        p_other = mann_whitney(x, y, other)
        p_two = mann_whitney(x, y, "two-sided")
        row.update(p_claim=float(p_claim), p_other=float(p_other), p_two=float(p_two),
                   verdict=_verdict(contrast.expect, p_claim, p_other, len(x), len(y),
                                    p_two))  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def _verdict(expect: str, p_claim: float, p_other: float, n: int, m: int,
             p_two: float | None = None) -> str:  # fmt: skip
    floor = smallest_p(n, m)
    if expect == "similar":
        if p_two is None:
            p_two = min(1.0, 2 * min(p_claim, p_other))
        if p_two <= ALPHA:
            return "contradicted: a difference was detected"
        if smallest_p(n, m, two_sided=True) > ALPHA:
            return (f"no difference detected: {n} against {counted(m, 'seed')} cannot reach a "
                    f"two-sided p <= {ALPHA:g} (which does not show equality)")  # fmt: skip
        return "no difference detected (which does not show equality)"
    if p_claim <= ALPHA:
        return "supported"
    if p_other <= ALPHA:
        return "contradicted: the opposite direction"
    if floor > ALPHA:
        return f"not testable: {n} against {counted(m, 'seed')} cannot reach p <= {ALPHA:g}"
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


def sentence(row: pd.Series, per: tuple[str, ...], digits: int = 2) -> str:
    """'1/sqrt(d_k) fits better than unscaled (sort: exact_match sqrt 0.95 vs none 0.74,
    3 vs 3 seeds, p = 0.05, supported)'."""
    group = "".join(f"{row[c]}: " for c in per)
    metric = ("change in " if row["change"] else "") + row["metric"]
    return (
        f"{row['claim']} ({group}{metric} {row['a']} {row['mean_a']:.{digits}f} vs "
        f"{row['b']} {row['mean_b']:.{digits}f}, {row['n_a']} vs "
        f"{counted(int(row['n_b']), 'seed')}, "
        f"p = {_p(row)}, {row['verdict']})"
    )


def _p(row: pd.Series) -> str:
    """The p the verdict was read from, printed on the same side of ALPHA as it is."""
    if row["expect"] == "similar":
        return f"{fmt_vs(_two_sided(row), ALPHA, 3, 'g')} (two-sided)"
    return fmt_vs(row["p_claim"], ALPHA, 3, "g")


def _two_sided(row: pd.Series) -> float:
    if "p_two" in row and not pd.isna(row["p_two"]):
        return float(row["p_two"])
    return min(1.0, 2 * min(row["p_claim"], row["p_other"]))


def ci_text(row: pd.Series, arm: str, digits: int = 2) -> str:
    return fmt_ci(row[f"mean_{arm}"], row[f"low_{arm}"], row[f"high_{arm}"], digits)


def section(rep, contrasts: tuple[Contrast, ...], tables: dict[str, pd.DataFrame],
            where: str = "", sides: str = "arms") -> list[str]:  # fmt: skip
    """The report's Verdicts section: one row per claim (and group) with both arms' means and
    95% bootstrap intervals over seeds, the exact p and the verdict; the papers the claims come
    from, quoted from the references file. Returns one sentence per verdict (the answer).
    `sides`: what the compared values are (a head study compares methods)."""
    table = verdict_table(contrasts, tables, where)
    if table.empty:
        return []
    rep.heading("Verdicts")
    rep.paragraph(
        f"Each claim compares two {sides} on one number per seed (the mean, or for a spread the "
        "standard deviation, of the matching rows) with an exact one-sided Mann-Whitney test; "
        f"'supported' needs p <= {ALPHA:g} in the claimed direction, 'contradicted' p <= "
        f"{ALPHA:g} the other way. With 3 seeds against 3 the smallest possible p is "
        f"{smallest_p(3, 3):.2g}, so 'not shown' can mean too few seeds as well as no effect. "
        "A claim of no difference ('similar') is read from the exact two-sided test (3 against "
        f"3 seeds: at least {smallest_p(3, 3, two_sided=True):.2g}). "
        + _interval_note([*table["n_a"], *table["n_b"]])
    )
    shown = []
    for c in contrasts:
        for _, row in table[table["claim"] == c.claim].iterrows():
            group = ", ".join(str(row[k]) for k in c.per)
            shown.append({
                "claim": c.claim + (f" ({group})" if group else ""),
                "metric": c.metric + WITHIN_NOTE[c.within]
                + (" (change from the baseline rows)" if c.baseline else ""),
                "a": f"{row['a']} {ci_text(row, 'a')}", "b": f"{row['b']} {ci_text(row, 'b')}",
                "seeds": f"{row['n_a']} vs {row['n_b']}", "p": _p(row),
                "verdict": row["verdict"],
                "source": published(c.reference).short if c.reference else "",
            })  # fmt: skip
    rep.table(pd.DataFrame(shown), "verdicts.csv")
    sources = sorted({c.reference for c in contrasts if c.reference})
    if sources:
        rep.bullets([_source_line(published(ref)) for ref in sources])
    return [sentence(row, next(c.per for c in contrasts if c.claim == row["claim"]))
            for _, row in table.iterrows() if row["verdict"] != "no data"]  # fmt: skip


def _interval_note(counts) -> str:
    """What the intervals beside the means are, for arms of `counts` seeds."""
    if min(counts, default=2) >= 2:
        return "Means are over seeds with 95% bootstrap intervals."
    if max(counts) < 2:
        return "Each arm has one seed here, so no interval is shown."
    return "Means are over seeds with 95% bootstrap intervals (none for an arm with one seed)."


def _source_line(paper) -> str:
    return f"**{paper.short}**: {paper.cite}. {paper.claim} ({paper.claim_source})."
