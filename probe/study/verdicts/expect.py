"""Expectations on a study's result tables, checked after a run (pass/fail, JUnit XML for CI).

[[expect]]
name = "every encoding fits the training lengths"   # optional
table = "eval"                   # a table the study writes
metric = "exact_match"           # a row of its metric/statistic column (or a column name)
where = { length = "<= L" }      # filters: a value, a list of values, "op number", or a list
                                 # of "op number" (all must hold); the number may be a column
                                 # of the row times a factor: "L" (the cell's longest training
                                 # length), "2L", "L_min"
per = ["arm", "task"]            # one check per group (default: one over all rows)
reduce = "mean"                  # mean, min or max over the matching rows
baseline = { fraction = 0.0 }    # optional: check reduce(rows) - reduce(baseline rows)
bound = ">= 0.99"
when = "always"                  # always, full (skipped with --smoke) or smoke
"""

from __future__ import annotations

import operator
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probe.errors import ProbeError
from probe.fields import check_keys
from probe.report.files import atomic_write_text
from probe.words import did_you_mean

OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
       "==": operator.eq, "!=": operator.ne}  # fmt: skip
_COMPARISON = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(.+?)\s*$")
KEYS = ("name", "table", "metric", "where", "per", "reduce", "baseline", "bound", "when")
REDUCE = ("mean", "min", "max")
WHEN = ("always", "full", "smoke")


@dataclass(frozen=True)
class Condition:
    column: str
    op: str  # one of OPS, or "in"
    value: Any  # a number, a string, a tuple (for "in"), or (column, k): k times the row's column

    def describe(self) -> str:
        if self.op == "in":
            return f"{self.column} in {list(self.value)}"
        value = self.value
        if isinstance(value, tuple):
            value = value[0] if value[1] == 1 else f"{value[1]:g}{value[0]}"
        return f"{self.column} {self.op} {value}" if self.op != "==" else f"{self.column}={value}"

    def mask(self, df: pd.DataFrame) -> pd.Series:
        column = df[self.column]
        if self.op == "in":
            return column.isin(list(self.value))
        value = self.value
        if isinstance(value, tuple):
            if value[0] not in df.columns:
                raise ProbeError(
                    f"'{self.describe()}' refers to column {value[0]}, which the table lacks."
                )
            value = df[value[0]] * value[1]
        return OPS[self.op](column, value)


@dataclass(frozen=True)
class Expectation:
    name: str
    table: str
    metric: str
    op: str
    bound: float
    where: tuple[Condition, ...] = ()
    per: tuple[str, ...] = ()
    reduce: str = "mean"
    baseline: tuple[Condition, ...] | None = None
    when: str = "always"

    @property
    def bound_text(self) -> str:
        return f"{self.op} {self.bound:g}"

    def applies(self, smoke: bool) -> bool:
        return self.when == "always" or self.when == ("smoke" if smoke else "full")


@dataclass(frozen=True)
class Outcome:
    name: str  # the expectation's name, plus the group when `per` is set
    passed: bool
    observed: float | None
    bound: str
    detail: str = ""


def _number(text: str) -> float | tuple[str, float] | None:
    """A float, (column, factor) for "L" / "2L" / "L_min", or None."""
    match = re.fullmatch(r"(\d*\.?\d*)\s*([A-Za-z_]\w*)", text)
    if match:
        return (match.group(2), float(match.group(1) or 1))
    try:
        return float(text)
    except ValueError:
        return None


def parse_conditions(table: Any, where: str) -> tuple[Condition, ...]:
    if not isinstance(table, dict):
        raise ProbeError(f'{where} must be a table like {{ length = "<= L" }}.')
    out = []
    for column, value in table.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, list | dict) or item is None:
                raise ProbeError(
                    f"{where} {column}: '{item}' is not a value to compare with; write a number, "
                    'a string, a list of them or a comparison such as "<= L".'
                )
        comparisons = [_COMPARISON.match(v) if isinstance(v, str) else None for v in items]
        if isinstance(value, list) and not all(comparisons):
            out.append(Condition(column, "in", tuple(value)))
            continue
        for item, match in zip(items, comparisons, strict=True):
            if match is None:
                out.append(Condition(column, "==", item))
                continue
            op, operand = match.groups()
            if op in ("==", "!="):  # a literal: a number or a string
                number = _number(operand)
                out.append(Condition(column, op, number if isinstance(number, float) else operand))
                continue
            number = _number(operand)
            if number is None:
                raise ProbeError(f"{where} {column}: '{item}' needs a number after '{op}'.")
            out.append(Condition(column, op, number))
    return tuple(out)


GRID_TABLES = "(train, plus those of the [analysis] steps)"


def parse_expectation(raw: Any, where: str, tables: tuple[str, ...] | None = None,
                      note: str = GRID_TABLES) -> Expectation:  # fmt: skip
    """An expectation from a study file's [[expect]] table; `tables` (when given) are the tables
    the study writes (`note` says which they are), so a misspelt table is caught before any
    training."""
    check_keys(raw, tuple(KEYS), where)
    for key in ("table", "metric", "bound"):
        if key not in raw:
            raise ProbeError(f"{where} needs '{key}' (for example table = \"eval\", "
                             "metric = \"exact_match\", bound = \">= 0.99\").")  # fmt: skip
    for key in ("table", "metric"):
        if not isinstance(raw[key], str) or not raw[key]:
            raise ProbeError(f"{where} {key} must be a non-empty string, got {raw[key]!r}.")
    if not isinstance(raw.get("name", ""), str):
        raise ProbeError(f"{where} name must be a string, got {raw['name']!r}.")
    if tables is not None and raw["table"] not in tables:
        raise ProbeError(
            f"{where} table '{raw['table']}' is not one the study writes."
            f"{did_you_mean(raw['table'], tables)} Its tables: {', '.join(tables)} {note}."
        )
    match = _COMPARISON.match(str(raw["bound"]))
    number = _number(match.group(2)) if match else None
    if match is None or not isinstance(number, float):
        raise ProbeError(f"{where} bound '{raw['bound']}' must read like '>= 0.99' or '<= 0.01'.")
    reduce = raw.get("reduce", "mean")
    if reduce not in REDUCE:
        raise ProbeError(
            f"{where} reduce: unknown reduction '{reduce}'.{did_you_mean(str(reduce), REDUCE)} "
            f"Available: {', '.join(REDUCE)}."
        )
    when = raw.get("when", "always")
    if when not in WHEN:
        raise ProbeError(
            f"{where} when: unknown choice '{when}'.{did_you_mean(str(when), WHEN)} "
            f"Available: {', '.join(WHEN)}."
        )
    per = raw.get("per", [])
    if isinstance(per, str):
        per = [per]
    if not isinstance(per, list) or not all(isinstance(c, str) for c in per):
        raise ProbeError(f"{where} per must be a column name or a list of them, got {per!r}.")
    conditions = parse_conditions(raw.get("where", {}), f"{where} where")
    baseline = parse_conditions(raw["baseline"], f"{where} baseline") if "baseline" in raw else None
    name = raw.get("name") or " ".join(
        [raw["metric"], *(f"({c.describe()})" for c in conditions), reduce, str(raw["bound"])]
    )
    return Expectation(
        name=name, table=raw["table"], metric=raw["metric"], op=match.group(1), bound=number,
        where=conditions, per=tuple(per), reduce=reduce, baseline=baseline, when=when,
    )  # fmt: skip


def select_rows(
    df: pd.DataFrame,
    table: str,
    metric: str,
    conditions: tuple[Condition, ...],
    needed: tuple[str, ...] | list[str] = (),
    owner: str = "",
) -> pd.DataFrame:
    """The rows of `table` (as `df`) an expectation or contrast reads: its metric (the rows of a
    long table, or a wide table's column as `value`) under its conditions; every column they name
    must exist. `owner` prefixes errors ("contrast '...': ")."""
    for column in [c.column for c in conditions] + list(needed):
        if column not in df.columns:
            hint = did_you_mean(column, list(df.columns))
            raise ProbeError(
                f"{owner}table '{table}' has no column '{column}'.{hint}"
                f" Columns: {', '.join(df.columns)}."
            )
    for key in ("metric", "statistic"):
        if key in df.columns:
            names = sorted(str(v) for v in df[key].dropna().unique())
            if metric not in names:
                raise ProbeError(
                    f"{owner}table '{table}' has no {key} '{metric}'.{did_you_mean(metric, names)}"
                    f" Its {key} values: {', '.join(names) or 'none'}."
                )
            df = df[df[key] == metric]
            break
    else:
        if metric not in df.columns:
            raise ProbeError(
                f"{owner}table '{table}' has no metric or column '{metric}'."
                f"{did_you_mean(metric, list(df.columns))} Columns: {', '.join(df.columns)}."
            )
        df = df.assign(value=df[metric])
    for condition in conditions:
        df = df[condition.mask(df)]
    return df


def _reduced(df: pd.DataFrame, exp: Expectation) -> pd.Series:
    if exp.per:
        return df.groupby(list(exp.per), sort=True)["value"].agg(exp.reduce)
    if df.empty:
        return pd.Series(dtype=float)
    return pd.Series([df["value"].agg(exp.reduce)], index=[None])


def check(exp: Expectation, tables: dict[str, pd.DataFrame], owner: str = "") -> list[Outcome]:
    """One outcome per group of `exp.per` (one in all without it); `owner` (the study file and
    the expectation) prefixes the line that says why an expectation cannot be checked."""
    if exp.table not in tables:
        detail = f"the study wrote no table '{exp.table}' (it wrote: {', '.join(sorted(tables))})"
        return [Outcome(exp.name, False, None, exp.bound_text, detail)]
    try:
        df = tables[exp.table]
        rows = select_rows(df, exp.table, exp.metric, exp.where, exp.per, owner)
        observed = _reduced(rows, exp)
        if exp.baseline is not None:
            base = _reduced(select_rows(df, exp.table, exp.metric, exp.baseline, exp.per, owner),
                            exp)  # fmt: skip
            observed = (observed - base).dropna()
    except ProbeError as exc:
        return [Outcome(exp.name, False, None, exp.bound_text, str(exc))]
    if observed.empty:
        return [Outcome(exp.name, False, None, exp.bound_text, "no rows match the filters")]
    outcomes = []
    for group, value in observed.items():
        keys = group if isinstance(group, tuple) else (group,)
        label = ", ".join(f"{c}={k}" for c, k in zip(exp.per, keys, strict=False))
        name = f"{exp.name} [{label}]" if label else exp.name
        ok = bool(OPS[exp.op](float(value), exp.bound))
        outcomes.append(Outcome(name, ok, float(value), exp.bound_text))
    return outcomes


def check_all(expectations: tuple[Expectation, ...], tables: dict[str, pd.DataFrame],
              smoke: bool, where: str = "") -> list[Outcome]:  # fmt: skip
    """Every outcome; `where` (the study file) names an expectation that cannot be checked."""
    return [o for i, e in enumerate(expectations) if e.applies(smoke)
            for o in check(e, tables, f"{where} [[expect]] #{i + 1}: ".lstrip())]  # fmt: skip


def write_junit(
    path: Path | str, suite: str, outcomes: list[Outcome], seconds: float = 0.0
) -> Path:
    """JUnit XML (one testcase per outcome) that CI systems display."""
    failures = sum(not o.passed for o in outcomes)
    root = ET.Element("testsuites", tests=str(len(outcomes)), failures=str(failures))
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(outcomes)),
                         failures=str(failures), errors="0", time=f"{seconds:.1f}")  # fmt: skip
    for o in outcomes:
        case = ET.SubElement(node, "testcase", classname=f"study.{suite}", name=o.name, time="0")
        observed = "none" if o.observed is None else f"{o.observed:.4g}"
        if not o.passed:
            message = f"observed {observed}, expected {o.bound}" + (
                f": {o.detail}" if o.detail else ""
            )
            failure = ET.SubElement(case, "failure", message=message, type="ExpectationFailed")
            failure.text = message
        else:
            ET.SubElement(case, "system-out").text = f"observed {observed}, expected {o.bound}"
    ET.indent(root)
    path = Path(path)
    atomic_write_text(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    return path
