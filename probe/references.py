"""The project's references file (`probe/references.toml`): published results with their sources.

A study's `[reference]` names an entry by id; its report quotes the entry's citation, setting,
claim, ranking and values, each with the place in the paper it comes from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.words import did_you_mean

PATH = Path(__file__).with_name("references.toml")


@dataclass(frozen=True)
class Value:
    what: str
    value: float
    source: str
    approximate: bool = False


@dataclass(frozen=True)
class Ranking:
    ranks: dict[str, float]  # our arm name -> the paper's rank (1 = best; ties share)
    what: str
    source: str
    approximate: bool = False


@dataclass(frozen=True)
class Published:
    id: str
    short: str  # "Kazemnejad et al. 2023"
    cite: str
    setting: str
    setting_source: str
    claim: str = ""
    claim_source: str = ""
    names: dict[str, str] = field(default_factory=dict)  # our arm -> the paper's name
    ranking: Ranking | None = None
    values: tuple[Value, ...] = ()
    quotes: dict[str, str] = field(default_factory=dict)  # the paper's words, verbatim, by use

    def name(self, arm: str) -> str:
        return self.names.get(arm, arm)


def _entry(key: str, raw: dict[str, Any]) -> Published:
    try:
        ranking = Ranking(**raw["ranking"]) if "ranking" in raw else None
        values = tuple(Value(**v) for v in raw.get("values", []))
        rest = {k: v for k, v in raw.items() if k not in ("ranking", "values")}
        return Published(id=key, ranking=ranking, values=values, **rest)
    except TypeError as exc:
        raise ProbeError(f"{PATH} [{key}]: {exc}") from None


def load_references(path: Path = PATH) -> dict[str, Published]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {key: _entry(key, raw) for key, raw in data.items()}


def published(ref_id: str, path: Path = PATH) -> Published:
    """The entry `ref_id` of the references file, or a ProbeError that lists the ids."""
    entries = load_references(path)
    if ref_id not in entries:
        raise ProbeError(
            f"no reference '{ref_id}' in {path.name}.{did_you_mean(ref_id, list(entries))} "
            f"Available: {', '.join(entries)}."
        )
    return entries[ref_id]
