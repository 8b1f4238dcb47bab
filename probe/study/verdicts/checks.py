"""A study's verdicts, for both kinds of study: its [[expect]] and [[contrast]] tables parsed
against the tables the study writes, stored with its results and read back, checked on its
result tables and shown in its report (the Verdicts and Expectations sections).

Grid studies and head studies write them alike (see expect.py and contrast.py). In a head study
a contrast compares two values of a table's `column`, "method" unless given (two estimators, or
a method and random rankings, over the seeds' disjoint text splits); a head study has no arms,
so `column = "arm"` and `fitted = true` are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from probe.errors import ProbeError
from probe.report.report import MarkdownReport
from probe.study.verdicts import contrast_text
from probe.study.verdicts.contrast import Contrast, parse_contrast
from probe.study.verdicts.expect import (
    GRID_TABLES,
    Condition,
    Expectation,
    Outcome,
    check_all,
    parse_expectation,
)
from probe.words import counted, did_you_mean


def parse_verdicts(
    data: dict[str, Any],
    where: str,
    tables: tuple[str, ...],
    note: str = GRID_TABLES,
    methods: dict[str, tuple[str, ...]] | None = None,
) -> tuple[tuple[Expectation, ...], tuple[Contrast, ...]]:
    """The [[expect]] and [[contrast]] tables of a parsed study file. `tables`: those the study
    writes (`note` says which they are); `methods` (a head study's): per table, the methods it
    holds, which makes the study a head study (a contrast's column defaults to "method" and its
    a and b are checked against them)."""
    for key, noun in (("expect", "expectations"), ("contrast", "contrasts")):
        if not isinstance(data.get(key, []), list):
            raise ProbeError(f"{where}: write {noun} as [[{key}]] tables.")
    expectations = tuple(
        parse_expectation(e, f"{where} [[expect]] #{i + 1}", tables, note)
        for i, e in enumerate(data.get("expect", []))
    )
    contrasts = []
    for i, raw in enumerate(data.get("contrast", [])):
        here = f"{where} [[contrast]] #{i + 1}"
        if methods is not None and isinstance(raw, dict):
            raw = _head_contrast(raw, here)
        c = parse_contrast(raw, here, tables)
        valid = (methods or {}).get(c.table, ()) if c.column == "method" else ()
        for side in (c.a, c.b) if valid else ():
            if side not in valid:
                raise ProbeError(
                    f"{here}: table '{c.table}' holds no method '{side}'."
                    f"{did_you_mean(side, list(valid))} Its methods: {', '.join(valid)}."
                )
        contrasts.append(c)
    return expectations, tuple(contrasts)


def _head_contrast(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """A head study's contrast table, its column "method" unless given; what only grid studies
    have (arms, fitting the training lengths) is refused."""
    if raw.get("fitted", False) is True:
        raise ProbeError(f"{where} fitted = true compares only trained arms that fit their "
                         "training lengths; a head study trains nothing: drop fitted.")  # fmt: skip
    if raw.get("column") == "arm":
        raise ProbeError(f'{where} column = "arm": a head study has no arms; compare two '
                         'methods with column = "method" (the default) or name another '
                         "column.")  # fmt: skip
    return {"column": "method", **raw}


def verdicts_dict(expectations: tuple[Expectation, ...],
                  contrasts: tuple[Contrast, ...]) -> dict[str, Any]:  # fmt: skip
    """The expectations and contrasts as JSON-ready lists (none: no keys), for study.json."""
    out: dict[str, Any] = {}
    if expectations:
        out["expect"] = [dataclasses.asdict(e) for e in expectations]
    if contrasts:
        out["contrasts"] = [dataclasses.asdict(c) for c in contrasts]
    return out


def _conditions(raw: list[dict[str, Any]] | None) -> tuple[Condition, ...] | None:
    if raw is None:
        return None
    return tuple(Condition(c["column"], c["op"], tuple(c["value"]) if isinstance(c["value"], list)
                           else c["value"]) for c in raw)  # fmt: skip


def _restored(cls, raw: dict[str, Any]):
    """An expectation or contrast from its dict; lists become tuples again (a study.json
    written before contrasts had `paired` has none: unpaired)."""
    lists = {key: tuple(raw[key]) for key in ("per", "paired") if key in raw}
    return cls(**{**raw, "where": _conditions(raw["where"]), "baseline": _conditions(
        raw["baseline"]), **lists})  # fmt: skip


def verdicts_from_dict(
    data: dict[str, Any],
) -> tuple[tuple[Expectation, ...], tuple[Contrast, ...]]:
    """What `verdicts_dict` wrote, read back from a study.json."""
    return (tuple(_restored(Expectation, e) for e in data.get("expect", [])),
            tuple(_restored(Contrast, c) for c in data.get("contrasts", [])))  # fmt: skip


def expectations_section(rep: MarkdownReport, outcomes: list[Outcome]) -> list[str]:
    """The report's Expectations section; returns the finding that sums it up (none without
    expectations)."""
    if not outcomes:
        return []
    rep.heading("Expectations")
    table = pd.DataFrame([{
        "check": o.name, "observed": "–" if o.observed is None else f"{o.observed:.3f}",
        "expected": o.bound, "result": "pass" if o.passed else f"**FAIL** {o.detail}".strip(),
    } for o in outcomes])  # fmt: skip
    rep.table(table, "expectations.csv")
    failed = sum(not o.passed for o in outcomes)
    if failed:
        return [f"{failed} of {counted(len(outcomes), 'expectation')} FAILED (see Expectations)."]
    return [
        f"All {len(outcomes)} expectations pass."
        if len(outcomes) > 1
        else "The expectation passes."
    ]


def report_verdicts(
    rep: MarkdownReport,
    expectations: tuple[Expectation, ...],
    contrasts: tuple[Contrast, ...],
    tables: dict[str, pd.DataFrame],
    smoke: bool,
    where: str = "",
    sides: str = "arms",
) -> tuple[list[str], list[Outcome], list[str]]:
    """The Verdicts section (the contrasts) then the Expectations section; returns the
    contrasts' sentences (for the answer), the expectations' outcomes and the finding that sums
    them up. `where` (the study file) names an expectation or contrast that cannot be read;
    `sides`: what the contrasts compare."""
    answers = contrast_text.section(rep, contrasts, tables, where, sides)
    outcomes = check_all(expectations, tables, smoke, where)
    return answers, outcomes, expectations_section(rep, outcomes)


def head_verdicts(rep: MarkdownReport, study: dict[str, Any], tables: dict[str, pd.DataFrame],
                  where: str, answer_at: int) -> list[Outcome]:  # fmt: skip
    """A head report's Verdicts and Expectations sections, from its study.json (`study`); the
    contrasts' sentences join the answer, block `answer_at` of `rep`."""
    expectations, contrasts = verdicts_from_dict(study)
    methods = all(c.column == "method" for c in contrasts)
    answers, outcomes, _ = report_verdicts(rep, expectations, contrasts, tables,
                                           bool(study.get("smoke")), where,
                                           "methods" if methods else "values")  # fmt: skip
    if answers:
        rep.blocks[answer_at] += " Over seeds: " + "; ".join(answers) + "."
    return outcomes
