"""Head studies of a real checkpoint: `studies/*.toml` files with a `[model] source`.

A head study imports one model (a bundled one such as `bundled:minilm`, a Hugging Face folder or
a GGUF file), cuts the shipped text (or a given file) into disjoint batches, and measures its
heads: importance by several estimators, pruning curves by head, by key/value group or by
attention sub-layer, head roles and retrieval heads, the effect of removing the retrieval heads,
and the speed of the physically pruned models. The sections a file may have are those its step
kinds declare (`steps.study_sections`: each with its options, bounds and checks). Every error
names the file, the section and the field; `[smoke]` overrides any option to scale the study
down for CI.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.fields import check_keys, from_dict, shown
from probe.options import check
from probe.rope_experiment import RopeRequest
from probe.study.heads.checks import check_source, check_text
from probe.study.heads.steps import study_sections, table_names
from probe.study.heads.study import HeadStudy, StudySection
from probe.study.settings import heading_dict, study_heading
from probe.study.verdicts.checks import parse_verdicts, verdicts_dict
from probe.words import did_you_mean

__all__ = ["HeadStudy", "check_head_study", "head_study_dict", "parse_head_study",
           "smoke_head_study", "top_level"]  # fmt: skip

STUDY_KEYS = ("name", "question", "description", "title")
HEAD_TABLES = "(a head study's tables; those its sections ask for are written)"


def top_level() -> tuple[str, ...]:
    """The tables a head study file may have: [study], [model], the sections of its step kinds
    (`steps.study_sections`), the verdicts and [smoke]."""
    return ("study", "model", *(s.name for s in study_sections()), "expect", "contrast", "smoke")


def _check(study: HeadStudy) -> HeadStudy:
    """The names in each section (methods), the range of every bounded field, then how each
    section's fields fit together (its declaration's `check`)."""
    sections = study_sections()
    for section in sections:
        options = study.sections[section.name]
        _check_methods(section, options, study.where)
        check(options, f"{study.where} [{section.name}]")
    for section in sections:
        if section.check is not None:
            section.check(study)
    return study


def _check_methods(section: StudySection, options: Any, where: str) -> None:
    """Every method a section lists is one it knows, listed once."""
    if section.methods is None:
        return
    valid = list(section.methods())
    for name in section.method_fields:
        methods = getattr(options, name)
        for m in methods:
            if m not in valid:
                raise ProbeError(
                    f"{where} [{section.name}] {name}: unknown method '{m}'."
                    f"{did_you_mean(m, valid)} Available: {', '.join(valid)}."
                )
        if len(set(methods)) < len(methods):
            raise ProbeError(
                f"{where} [{section.name}] {name} lists a method twice: {list(methods)}."
            )


def _sections(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Every section's options, in order: the file's, else the defaults."""
    return {s.name: from_dict(s.options, data[s.name], f"{where} [{s.name}]") if s.name in data
            else s.options() for s in study_sections()}  # fmt: skip


def _methods(sections: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """The methods each section's table holds, for a contrast's a and b."""
    return {s.name: s.listed(sections[s.name]) for s in study_sections() if s.listed is not None}


def parse_head_study(data: dict[str, Any], path: Path | None = None) -> HeadStudy:
    where, head, name = study_heading(data, path, top_level(), STUDY_KEYS)
    model = check_keys(data["model"], ("source", "rope_scaling"), f"{where} [model]")
    if not isinstance(model.get("source"), str) or not model["source"]:
        raise ProbeError(
            f"{where} [model] needs a source: a bundled model (bundled:minilm), a Hugging Face "
            "folder or a GGUF file."
        )
    smoke = data.get("smoke")
    if smoke is not None:
        check_keys(smoke, tuple(s.name for s in study_sections()), f"{where} [smoke]")
        for section, options in smoke.items():
            if not isinstance(options, dict):
                raise ProbeError(
                    f"{where} [smoke] {section} must be a table of [{section}] options, got "
                    f"{shown(options)}."
                )
    sections = _sections(data, where)
    expectations, contrasts = parse_verdicts(data, where, table_names(), HEAD_TABLES,
                                             _methods(sections))  # fmt: skip
    study = HeadStudy(
        name=name,
        question=str(head["question"]).strip(),
        source=model["source"],
        path=path,
        rope_scaling=_rope_scaling(model, where),
        description=str(head.get("description", "")).strip(),
        title=str(head.get("title", "")),
        expectations=expectations,
        sections=sections,
        given=frozenset(name for name in sections if name in data),
        contrasts=contrasts,
        smoke=smoke,
    )
    return check_head_study(study)


def _rope_scaling(model: dict[str, Any], where: str) -> RopeRequest | None:
    """[model] rope_scaling = { kind = "linear", factor = 2.0 }: checked now, completed with the
    model's context once it is imported."""
    if "rope_scaling" not in model:
        return None
    return RopeRequest.from_dict(model["rope_scaling"], f"{where} [model] rope_scaling")


def check_head_study(study: HeadStudy) -> HeadStudy:
    """Everything about `study` that can be checked without importing its model (and the same
    of its smoke version): what `probe study validate` reports and `probe study run` checks
    first."""
    _check(study)
    check_source(study.source, study.where)
    check_text(study)
    if study.smoke is not None and not study.is_smoke:
        check_text(smoke_head_study(study))
    return study


def smoke_head_study(study: HeadStudy) -> HeadStudy:
    """The study with its [smoke] options merged over each section."""
    if study.is_smoke:
        return study
    where = f"{study.where} [smoke]"
    declared = {s.name: s for s in study_sections()}
    sections = dict(study.sections)
    for name, options in (study.smoke or {}).items():
        merged = {**dataclasses.asdict(sections[name]), **options}
        sections[name] = from_dict(declared[name].options, merged, f"{where} [{name}]")
    smoke = dataclasses.replace(study, is_smoke=True, sections=sections)
    try:
        return _check(smoke)
    except ProbeError as exc:  # name the section that made the value
        raise ProbeError(str(exc).replace(study.where, where, 1)) from None


def head_study_dict(study: HeadStudy) -> dict[str, Any]:
    """A JSON-ready description of the (possibly smoke) study, stored with its results."""
    out = {
        "kind": "heads",
        **heading_dict(study),
        "source": study.source,
    }
    if study.rope_scaling is not None:  # absent otherwise, as in the results of older runs
        out["rope_scaling"] = study.rope_scaling.to_dict()
    for section in study_sections():
        out[section.name] = dataclasses.asdict(study.sections[section.name])
    return {**out, **verdicts_dict(study.expectations, study.contrasts)}
