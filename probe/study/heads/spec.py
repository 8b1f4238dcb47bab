"""Head studies of a real checkpoint: `studies/*.toml` files with a `[model] source`.

A head study imports one model (a bundled one such as `bundled:minilm`, a Hugging Face folder or
a GGUF file), cuts the shipped text (or a given file) into disjoint batches, and measures its
heads: importance by several estimators, pruning curves by head, by key/value group or by
attention sub-layer, head roles and retrieval heads, the effect of removing the retrieval heads,
and the speed of the physically pruned models. Every error names the file, the section and the
field; `[smoke]` overrides any option to scale the study down for CI.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.fields import check_keys, from_dict, shown
from probe.heal.prune import METHODS as HEAL_METHODS
from probe.kv.plan import HEAD_METHODS
from probe.pruning.curves import CURVE_EXTRAS
from probe.pruning.importance import Method
from probe.rope_experiment import RopeRequest
from probe.study.heads.checks import check_source, check_text, check_values
from probe.study.heads.steps import TABLES
from probe.study.heads.study import (
    CurveOptions,
    HeadStudy,
    HealOptions,
    ImportanceOptions,
    KnockoutOptions,
    KVOptions,
    OperatingOptions,
    RoleOptions,
    TextOptions,
    TimingOptions,
)
from probe.study.settings import heading_dict, study_heading
from probe.study.verdicts.checks import parse_verdicts, verdicts_dict
from probe.words import did_you_mean

TOP_LEVEL = ("study", "model", "text", "importance", "curves", "roles", "knockout", "kv",
             "heal", "timing", "operating", "expect", "contrast", "smoke")  # fmt: skip
STUDY_KEYS = ("name", "question", "description", "title")
CURVE_METHODS = (*(str(m) for m in Method), *CURVE_EXTRAS)
KV_BASELINES = ("full", "streaming", "window")  # measured beside every [kv] section's methods
HEAD_TABLES = "(a head study's tables; those its sections ask for are written)"


SECTIONS = {
    "text": TextOptions,
    "importance": ImportanceOptions,
    "curves": CurveOptions,
    "roles": RoleOptions,
    "knockout": KnockoutOptions,
    "kv": KVOptions,
    "heal": HealOptions,
    "timing": TimingOptions,
    "operating": OperatingOptions,
}


def _check(study: HeadStudy) -> HeadStudy:
    """The names in `study` (methods) and how its sections fit together; the values of its
    fields are checked by `checks.check_values`."""
    where = study.where
    for section, field_name, methods, valid in (
        ("importance", "methods", study.importance.methods, [str(m) for m in Method]),
        ("curves", "methods", study.curves.methods, list(CURVE_METHODS)),
        ("curves", "group_methods", study.curves.group_methods, list(CURVE_METHODS)),
        ("kv", "methods", study.kv.methods, list(HEAD_METHODS)),
        ("heal", "methods", study.heal.methods, list(HEAL_METHODS)),
    ):
        for m in methods:
            if m not in valid:
                raise ProbeError(
                    f"{where} [{section}] {field_name}: unknown method '{m}'."
                    f"{did_you_mean(m, valid)} Available: {', '.join(valid)}."
                )
    extras = sorted(set(study.curves.group_methods) & set(CURVE_EXTRAS))
    if extras:
        raise ProbeError(
            f"{where} [curves] group_methods: {', '.join(extras)} prune by head or by layer, not "
            "by key/value group; list them under methods."
        )
    check_values(study)
    kv = study.kv
    if (kv.methods or kv.full_shares) and not kv.lengths:
        raise ProbeError(f"{where} [kv] needs lengths (passkey prompt lengths in tokens) to "
                         "measure its plans.")  # fmt: skip
    if 0 in kv.full_shares:
        raise ProbeError(f"{where} [kv] full_shares: 0 is the streaming-only cache, measured in "
                         "every run; list shares above 0.")  # fmt: skip
    if kv.methods and not kv.full_shares:
        raise ProbeError(f"{where} [kv] methods need full_shares (the shares of key/value heads "
                         "that keep the full cache, e.g. [0.1, 0.25]).")  # fmt: skip
    if study.heal.methods:
        _check_heal(study)
    if study.knockout.heads and not study.roles.needles:
        raise ProbeError(
            f"{where} [knockout] heads needs retrieval scores: set [roles] needles to 1 or more "
            "(or knockout heads = [] to skip the knock-out)."
        )
    return study


def _check_heal(study: HeadStudy) -> None:
    """The [heal] settings fit together (a step of whole rows, the steps measured after)."""
    try:
        study.heal.config()
    except ProbeError as exc:
        words = str(exc).replace("--", "").replace("-", "_")
        raise ProbeError(f"{study.where} [heal]: {words}") from None


def _sections(data: dict[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for name, cls in SECTIONS.items():
        if name in data:
            out[name] = from_dict(cls, data[name], f"{where} [{name}]")
    return out


def _methods(sections: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """The methods the importance, curves and kv tables hold, for a contrast's a and b."""
    importance = sections.get("importance", ImportanceOptions())
    curves = sections.get("curves", CurveOptions())
    kv = sections.get("kv", KVOptions())
    heal = sections.get("heal", HealOptions())
    return {"importance": importance.methods, "heal": heal.methods,
            "curves": tuple(dict.fromkeys((*curves.methods, *curves.group_methods))),
            "kv": (*kv.methods, *KV_BASELINES) if kv.lengths else ()}  # fmt: skip


def parse_head_study(data: dict[str, Any], path: Path | None = None) -> HeadStudy:
    where, head, name = study_heading(data, path, TOP_LEVEL, STUDY_KEYS)
    model = check_keys(data["model"], ("source", "rope_scaling"), f"{where} [model]")
    if not isinstance(model.get("source"), str) or not model["source"]:
        raise ProbeError(
            f"{where} [model] needs a source: a bundled model (bundled:minilm), a Hugging Face "
            "folder or a GGUF file."
        )
    smoke = data.get("smoke")
    if smoke is not None:
        check_keys(smoke, tuple(SECTIONS), f"{where} [smoke]")
        for section, options in smoke.items():
            if not isinstance(options, dict):
                raise ProbeError(
                    f"{where} [smoke] {section} must be a table of [{section}] options, got "
                    f"{shown(options)}."
                )
    sections = _sections(data, where)
    expectations, contrasts = parse_verdicts(data, where, TABLES, HEAD_TABLES,
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
        contrasts=contrasts,
        smoke=smoke,
        **sections,
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
    changes = {}
    for name, options in (study.smoke or {}).items():
        merged = {**dataclasses.asdict(getattr(study, name)), **options}
        changes[name] = from_dict(SECTIONS[name], merged, f"{where} [{name}]")
    smoke = dataclasses.replace(study, is_smoke=True, **changes)
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
    for name in SECTIONS:
        out[name] = dataclasses.asdict(getattr(study, name))
    return {**out, **verdicts_dict(study.expectations, study.contrasts)}
