"""Study files: `studies/*.toml` read with tomllib and validated into frozen objects.

A study is a base config, a grid of overrides crossed with each other, named variants (extra
cells), the analyses run on every trained model, expectations on the result tables, a report
section and a `[smoke]` section that scales it all down for CI. Every error names the file, the
section and the field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.fields import check_keys, from_dict, shown
from probe.references import published
from probe.study.documents import read_toml
from probe.study.grid.cells import expand
from probe.study.grid.definition import Override, Reference, Study, Variant
from probe.study.grid.steps import get_step, options_dict, parse_options
from probe.study.settings import (
    SECTIONS,
    check_key,
    check_setting,
    flatten,
    heading_dict,
    study_heading,
)
from probe.study.verdicts.checks import parse_verdicts
from probe.training.presets import with_preset
from probe.words import did_you_mean

TOP_LEVEL = (
    "study",
    "base",
    "grid",
    "variant",
    "override",
    "analysis",
    "expect",
    "report",
    "reference",
    "contrast",
    "smoke",
)
STUDY_KEYS = ("name", "question", "description")
VARIANT_KEYS = ("name", "description", *SECTIONS)
REPORT_KEYS = ("by", "title")
REFERENCE_KEYS = ("id", "metric", "lengths", "notes")
SMOKE_KEYS = ("grid", "variants", "analysis", *SECTIONS)


def _section_configs(base: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Each section's base settings, laid over the `preset` when [base] names one."""
    name = base.get("preset")
    if name is not None and not isinstance(name, str):
        raise ProbeError(f"{where} [base] preset must be a name, got {name!r}.")
    for section in SECTIONS:
        if not isinstance(base.get(section, {}), dict):
            raise ProbeError(f"{where} [base.{section}] must be a table of settings, "
                             f"got {shown(base[section])}.")  # fmt: skip
    try:
        base = with_preset(name, {s: dict(base.get(s, {})) for s in SECTIONS})
    except ProbeError as exc:
        raise ProbeError(f"{where} [base] {exc}") from None
    out = {}
    for section, cls in SECTIONS.items():
        settings = dict(base.get(section, {}))
        try:
            cls.from_dict(settings)  # validates names and values now
        except (ProbeError, TypeError) as exc:
            raise ProbeError(f"{where} [base.{section}] {exc}") from None
        out[section] = settings
    return out


def _grid(raw: Any, where: str) -> dict[str, tuple[Any, ...]]:
    if not isinstance(raw, dict):
        raise ProbeError(f"{where} [grid] must be a table of setting = [values].")
    grid = {}
    for key, values in flatten(raw, f"{where} [grid]").items():
        if not isinstance(values, list) or not values:
            raise ProbeError(
                f"{where} [grid] '{key}' must be a non-empty list of values, got {values!r}."
            )
        for value in values:
            check_setting(key, value, f"{where} [grid]")
        grid[key] = tuple(values)
    return grid


def _variants(raw: Any, where: str) -> tuple[Variant, ...]:
    if not isinstance(raw, list):
        raise ProbeError(f"{where}: write variants as [[variant]] tables.")
    variants, seen = [], set()
    for i, table in enumerate(raw):
        here = f"{where} [[variant]] #{i + 1}"
        check_keys(table, VARIANT_KEYS, here)
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise ProbeError(f"{here} needs a name (a short label used in tables and plots).")
        if name in seen:
            raise ProbeError(f"{here}: the variant name '{name}' is used twice.")
        seen.add(name)
        overrides = flatten({k: v for k, v in table.items() if k in SECTIONS}, here)
        for key, value in overrides.items():
            check_setting(key, value, f"{here} ({name})")
        variants.append(Variant(name, overrides, str(table.get("description", ""))))
    return tuple(variants)


def _overrides(raw: Any, where: str) -> tuple[Override, ...]:
    if not isinstance(raw, list):
        raise ProbeError(f"{where}: write conditional settings as [[override]] tables.")
    out = []
    for i, table in enumerate(raw):
        here = f"{where} [[override]] #{i + 1}"
        check_keys(table, ("where", *SECTIONS), here)
        if not isinstance(table.get("where"), dict) or not table["where"]:
            raise ProbeError(f'{here} needs where = {{ "task.name" = "addition" }} or similar.')
        match = flatten(table["where"], f"{here} where")
        settings = flatten({k: v for k, v in table.items() if k in SECTIONS}, here)
        if not settings:
            raise ProbeError(f"{here} sets nothing; add settings such as train.steps = 4000.")
        for key, value in settings.items():
            check_setting(key, value, here)
        values = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in match.items()}
        out.append(Override(values, settings))
    return tuple(out)


def _analysis(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProbeError(f"{where} [analysis] must hold one table per analysis step.")
    out = {}
    for name, options in raw.items():
        if not isinstance(options, dict):
            raise ProbeError(
                f"{where} [analysis] {name} must be a table of options ([analysis.{name}], empty "
                f"for the defaults), got {shown(options)}."
            )
        try:
            out[name] = parse_options(name, options)
        except (ProbeError, TypeError) as exc:
            raise ProbeError(f"{where} [analysis] {exc}") from None
    return out


def _reference(raw: Any, where: str) -> Reference:
    here = f"{where} [reference]"
    table = dict(check_keys(raw, REFERENCE_KEYS, here))
    if not isinstance(table.get("id"), str):
        raise ProbeError(f"{here} needs an id: the entry of probe/references.toml to compare with.")
    if table.get("lengths", "unseen") not in ("unseen", "seen"):
        raise ProbeError(f"{here} lengths must be 'unseen' or 'seen', got {table['lengths']!r}.")
    try:
        published(table["id"])
    except ProbeError as exc:
        raise ProbeError(f"{here} {exc}") from None
    return from_dict(Reference, table, here)


def parse_study(data: dict[str, Any], path: Path | None = None) -> Study:
    """Validate a parsed study file into a `Study` (every cell's configs are checked too)."""
    where, head, name = study_heading(data, path, TOP_LEVEL, STUDY_KEYS)
    base = check_keys(data.get("base", {}), (*SECTIONS, "preset"), f"{where} [base]")
    report = check_keys(data.get("report", {}), REPORT_KEYS, f"{where} [report]")
    by = report.get("by", "model.pe")
    if not isinstance(by, str):
        raise ProbeError(f"{where} [report] by must be a setting such as 'model.pe', got {by!r}.")
    check_key(by, f"{where} [report] by")
    analysis = _analysis(data.get("analysis", {}), where)
    tables = ("train", *(t for step in analysis for t in get_step(step).tables))
    expectations, contrasts = parse_verdicts(data, where, tables)
    smoke = data.get("smoke")
    if smoke is not None:
        _check_smoke(smoke, where)
    study = Study(
        name=name,
        question=str(head["question"]).strip(),
        description=str(head.get("description", "")).strip(),
        path=path,
        base=_section_configs(base, where),
        grid=_grid(data.get("grid", {}), where),
        variants=_variants(data.get("variant", []), where),
        overrides=_overrides(data.get("override", []), where),
        analysis=analysis,
        expectations=expectations,
        by=by,
        title=str(report.get("title", "")),
        reference=_reference(data["reference"], where) if "reference" in data else None,
        contrasts=contrasts,
        smoke=smoke,
    )
    arms = {cell.arm for cell in expand(study)}  # every cell must build
    for i, c in enumerate(contrasts):
        for arm in (c.a, c.b) if c.column == "arm" else ():
            if arm not in arms:
                raise ProbeError(
                    f"{where} [[contrast]] #{i + 1}: no arm '{arm}'."
                    f"{did_you_mean(arm, sorted(arms))} Arms: {', '.join(sorted(arms))}."
                )
    if smoke is not None:
        expand(smoke_version(study))
    return study


def _check_smoke(smoke: Any, where: str) -> None:
    """The shape of [smoke]; its settings are checked by building the smoke version."""
    here = f"{where} [smoke]"
    check_keys(smoke, SMOKE_KEYS, here)
    names = smoke.get("variants", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProbeError(f"{here} variants must be a list of variant names, got {names!r}.")
    analysis = smoke.get("analysis", {})
    if not isinstance(analysis, dict) or not all(isinstance(o, dict) for o in analysis.values()):
        raise ProbeError(f"{here} analysis must hold one table of options per analysis step.")


def load_study(path: str | Path) -> Study:
    path = Path(path)
    return parse_study(read_toml(path), path)


def smoke_version(study: Study) -> Study:
    """The study scaled down by its [smoke] section: settings override the base and win over the
    [[override]]s, grid axes are replaced, variants may be narrowed to a list, analysis options
    are overridden."""
    if study.is_smoke:
        return study
    smoke = study.smoke or {}
    where = f"{study.where} [smoke]"
    overrides = flatten({k: v for k, v in smoke.items() if k in SECTIONS}, where)
    for key, value in overrides.items():
        if key in study.grid:
            raise ProbeError(f"{where}: '{key}' is a grid axis; shrink it under [smoke.grid].")
        check_setting(key, value, where)
    base = {s: dict(v) for s, v in study.base.items()}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        base[section][name] = value
    base = _section_configs(base, f"{where} (merged into base)")
    grid = dict(study.grid)
    for key, values in _grid(smoke.get("grid", {}), where).items():
        if key not in grid:
            hint = did_you_mean(key, list(grid))
            raise ProbeError(f"{where} [smoke.grid] '{key}' is not an axis of [grid].{hint}")
        grid[key] = values
    variants = study.variants
    if "variants" in smoke:
        names = [v.name for v in variants]
        for n in smoke["variants"]:
            if n not in names:
                raise ProbeError(f"{where} variants: no variant '{n}'.{did_you_mean(n, names)}")
        variants = tuple(v for v in variants if v.name in smoke["variants"])
    analysis = dict(study.analysis)
    for name, options in check_keys(
        smoke.get("analysis", {}), tuple(analysis), f"{where} analysis"
    ).items():
        merged = {**dataclasses.asdict(analysis[name]), **options}
        analysis[name] = _analysis({name: merged}, where)[name]
    conditionals = tuple(
        dataclasses.replace(
            o, overrides={k: v for k, v in o.overrides.items() if k not in overrides}
        )
        for o in study.overrides
    )
    return dataclasses.replace(
        study,
        base=base,
        grid=grid,
        variants=variants,
        overrides=conditionals,
        analysis=analysis,
        is_smoke=True,
    )


def study_dict(study: Study) -> dict[str, Any]:
    """A JSON-ready description of the (possibly smoke) study, stored in its results directory."""
    return {
        **heading_dict(study),
        "base": study.base,
        "grid": {k: list(v) for k, v in study.grid.items()},
        "variants": [dataclasses.asdict(v) for v in study.variants],
        "overrides": [dataclasses.asdict(o) for o in study.overrides],
        "analysis": {k: options_dict(v) for k, v in study.analysis.items()},
        "expect": [dataclasses.asdict(e) for e in study.expectations],
        "by": study.by,
        "reference": dataclasses.asdict(study.reference) if study.reference else None,
        **(
            {"contrasts": [dataclasses.asdict(c) for c in study.contrasts]}
            if study.contrasts
            else {}
        ),
    }
