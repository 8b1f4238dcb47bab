"""Settings in study files: `section.field` keys (model, task, train), checked by name and type
before any cell is built; the study's name, which names its results folder. Study files are
read by `probe.study.documents.read_toml`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.fields import check_field, check_keys, shown
from probe.train_config import TrainConfig
from probe.words import did_you_mean

SECTIONS = {"model": ModelConfig, "task": TaskConfig, "train": TrainConfig}


def flatten(table: dict[str, Any], where: str, allow: tuple[str, ...] = tuple(SECTIONS)) -> dict:
    """{"model": {"pe": x}} or {"model.pe": x} -> {"model.pe": x}; the first part must be a
    config section and the rest one of its fields."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if "." not in key and isinstance(value, dict):
            for sub, inner in value.items():
                flat[f"{key}.{sub}"] = inner
        else:
            flat[key] = value
    for key in flat:
        check_key(key, where, allow)
    return flat


def check_key(key: str, where: str, allow: tuple[str, ...] = tuple(SECTIONS)) -> None:
    section, _, name = key.partition(".")
    if section not in allow or not name:
        raise ProbeError(
            f"{where}: '{key}' is not a setting; write section.field with section one of "
            f"{', '.join(allow)} (for example 'model.pe' or 'train.seed')."
        )
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]
    if name not in names:
        raise ProbeError(
            f"{where}: unknown {section} field '{name}'.{did_you_mean(name, names)} "
            f"Valid fields: {', '.join(names)}."
        )


def check_setting(key: str, value: Any, where: str) -> None:
    """A ProbeError naming `where` and the field unless `value` has the type of setting `key`
    ("model.d_model"); the values themselves are checked when the cells are built."""
    section, _, name = key.partition(".")
    check_field(SECTIONS[section], name, value, f"{where}: {section}")


def check_name(name: Any, where: str) -> str:
    """The study's name, which names its folder under results/: a plain folder name."""
    if not isinstance(name, str) or not name.strip():
        raise ProbeError(f"{where} [study] needs a name.")
    # a separator in the name also refuses an absolute path
    if any(c in name for c in "/\\\0") or ".." in name or name.strip() == ".":
        raise ProbeError(
            f"{where} [study] name {name!r} must be a plain folder name (no '/', '\\' or '..'): "
            "it names the study's folder under results/."
        )
    return name


def study_heading(data: dict[str, Any], path: Path | None, top_level: tuple[str, ...],
                  study_keys: tuple[str, ...]) -> tuple[str, dict[str, Any], str]:  # fmt: skip
    """(where, the [study] table, the name) of a parsed study file of either kind, once its
    top-level sections are known and it asks a question."""
    where = str(path) if path is not None else "study"
    check_keys(data, top_level, where)
    head = check_keys(data.get("study", {}), study_keys, f"{where} [study]")
    name = check_name(head.get("name") or (path.stem if path is not None else None), where)
    if not head.get("question") or not isinstance(head["question"], str):
        raise ProbeError(f"{where} [study] needs a question: what does this study find out?")
    for key in ("description", "title"):
        if key in head and not isinstance(head[key], str):
            raise ProbeError(f"{where} [study] {key} must be a string, got {shown(head[key])}.")
    return where, head, name


def heading_dict(study: Any) -> dict[str, Any]:
    """What every kind of study stores about itself first: name, question, description, title,
    file and whether it is the smoke version."""
    return {
        "name": study.name,
        "question": study.question,
        "description": study.description,
        "title": study.title,
        "file": study.where,
        "smoke": study.is_smoke,
    }
