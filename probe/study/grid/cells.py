"""Grid expansion: a study's base config x grid axes, plus its named variants, into cells.

A cell is one model to train and the analyses to run on it. Its key is a hash of its full
configuration (model, task, training, analyses), so results are cached under it and a changed
setting never reuses a stale result; the device is left out, so a cell computed on one machine is
reused on another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from probe.config import ModelConfig
from probe.data.tasks import TaskConfig, sequence_length
from probe.errors import ProbeError
from probe.fields import to_plain
from probe.measure.evaluate import form_for
from probe.study.grid.definition import Study
from probe.study.grid.steps import options_dict, resolve_lengths
from probe.train_config import TrainConfig
from probe.words import counted

CELL_FORMAT = 1  # bump when a cell's results change meaning, to invalidate every cache
# fields added to the configs after cells of this format were first computed (each config
# declares its own): left out of the key while at their default, so adding a field keeps the cache
LATER_FIELDS = {"train": TrainConfig.ADDED_LATER, "model": ModelConfig.ADDED_LATER}
# fields renamed since: keyed under their first name, so the cells keep their keys
RENAMED = {"model": {"kept_heads": "heads"}}
RESERVED = {"cell", "arm", "variant", "L", "L_min", "length", "metric", "value", "n", "layer",
            "head", "site", "statistic", "step", "split", "fraction", "method", "depth",
            "seen", "n_tokens", "unit"}  # fmt: skip


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    index: int  # position in the study's cell order
    model: ModelConfig
    task: TaskConfig
    train: TrainConfig
    variant: str  # "" for a plain grid cell
    arm: str  # what the report compares: the variant's name, or the value of the study's `by`
    factors: tuple[tuple[str, Any], ...]  # (column, value) of each grid axis
    analysis: tuple[tuple[str, Any], ...]  # (step name, options) in run order

    def train_dict(self) -> dict[str, Any]:
        """Everything that determines the trained weights (not the device)."""
        configs = {"model": self.model, "task": self.task, "train": self.train}
        out: dict[str, Any] = {name: _key_dict(cfg, name) for name, cfg in configs.items()}
        out["train"].pop("device")
        return {**out, "format": CELL_FORMAT}

    @property
    def train_key(self) -> str:
        return _digest(self.train_dict())

    @property
    def key(self) -> str:
        analysis = {name: options_dict(o) for name, o in self.analysis}
        return _digest({**self.train_dict(), "analysis": analysis})

    @property
    def seed(self) -> int:
        return self.train.seed

    @property
    def train_max(self) -> int:
        return self.train.train_len[1]

    def identity(self) -> dict[str, Any]:
        """Columns added to every row of every table this cell writes."""
        ids = {"cell": self.key, "arm": self.arm, "variant": self.variant}
        ids.update(dict(self.factors))
        lo, hi = self.train.train_len
        ids.update({"task": str(self.task.name), "seed": self.seed, "L_min": lo, "L": hi})
        return ids

    @property
    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.factors if k not in ("seed", "task")]
        head = self.variant or " ".join(parts) or self.arm
        return f"{head} | {self.task.name} | seed {self.seed}"


def _key_dict(cfg: Any, section: str) -> dict[str, Any]:
    """cfg.to_dict() less the LATER_FIELDS that are at their default, RENAMED fields under
    their first names."""
    values = cfg.to_dict()
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name in LATER_FIELDS.get(section, ()):
        if values[name] == to_plain(defaults[name]):
            del values[name]
    renamed = RENAMED.get(section, {})
    return {renamed.get(name, name): value for name, value in values.items()}


def factor_column(key: str) -> str:
    """The table column of grid axis `key`: 'model.pe' -> 'pe', 'task.name' -> 'task'."""
    section, _, name = key.partition(".")
    if key == "task.name":
        return "task"
    return name if name not in RESERVED else f"{section}_{name}"


def _build(study: Study, overrides: dict[str, Any], where: str) -> tuple:
    """(model, task, train) of the base with `overrides` (grid values, a variant's settings),
    then each [[override]] whose `where` matches the configuration so far."""
    settings = {s: dict(v) for s, v in study.base.items()}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        settings[section][name] = value
    configs = _configs(settings, where)
    for conditional in study.overrides:
        values = {"model": configs[0], "task": configs[1], "train": configs[2]}
        if all(
            _plain(getattr(values[key.partition(".")[0]], key.partition(".")[2])) in accepted
            for key, accepted in conditional.where.items()
        ):
            for key, value in conditional.overrides.items():
                section, _, name = key.partition(".")
                settings[section][name] = value
            configs = _configs(settings, where)
    return configs


def _configs(settings: dict[str, dict[str, Any]], where: str) -> tuple:
    try:
        task = TaskConfig.from_dict(settings["task"])
        model_settings = {"vocab_size": task.vocab_size, **settings["model"]}
        model = ModelConfig.from_dict(model_settings)
        train = TrainConfig.from_dict(settings["train"])
    except (ProbeError, TypeError) as exc:
        raise ProbeError(f"{where}: {exc}") from None
    if model.vocab_size < task.vocab_size:
        raise ProbeError(
            f"{where}: model.vocab_size {model.vocab_size} is smaller than task '{task.name}' "
            f"needs ({task.vocab_size}); leave vocab_size out and it follows the task."
        )
    return model, task, train


def _check_lengths(study: Study, model: ModelConfig, task: TaskConfig, train: TrainConfig,
                   where: str) -> None:  # fmt: skip
    """A learned table or randomized positions cannot go past max_len: fail before training."""
    if model.max_positions is None and not train.random_positions:
        return
    lengths = [train.train_len[1]]
    for name, options in study.analysis.items():
        if hasattr(options, "lengths"):
            try:
                lengths += resolve_lengths(options.lengths, train.train_len[1])
            except ProbeError as exc:
                raise ProbeError(f"{where} [analysis.{name}] {exc}") from None
    longest = max(lengths)
    need = sequence_length(task, form_for(model.arch), longest)
    if need > model.max_len:
        why = "randomized positions" if train.random_positions else "learned table"
        raise ProbeError(
            f"{where}: task length {longest} of '{task.name}' needs "
            f"{counted(need, 'position')} but "
            f"model.max_len is {model.max_len} ({why}); raise model.max_len to at least {need} "
            "or evaluate at shorter lengths."
        )


def expand(study: Study) -> list[Cell]:
    """Every cell of the study, grid cells first (in file order of the axes), then variants."""
    where = f"{study.where}{' (smoke)' if study.is_smoke else ''}"
    columns = {key: factor_column(key) for key in study.grid}
    plans: list[tuple[str, dict[str, Any]]] = []
    for combo in itertools.product(*study.grid.values()):
        plans.append(("", dict(zip(study.grid, combo, strict=True))))
    for variant in study.variants:
        free = {k: v for k, v in study.grid.items() if k not in variant.overrides}
        for combo in itertools.product(*free.values()):
            plans.append(
                (variant.name, {**dict(zip(free, combo, strict=True)), **variant.overrides})
            )
    cells, seen = [], {}
    analysis = tuple(study.analysis.items())
    for variant, overrides in plans:
        here = f"{where} cell {variant or ''}{overrides}"
        model, task, train = _build(study, overrides, here)
        _check_lengths(study, model, task, train, here)
        configs = {"model": model, "task": task, "train": train}
        factors = tuple(
            (columns[k], _plain(getattr(configs[k.partition(".")[0]], k.partition(".")[2])))
            for k in study.grid
        )
        section, _, name = study.by.partition(".")
        arm = variant or str(_plain(getattr(configs[section], name)))
        cell = Cell(len(cells), model, task, train, variant, arm, factors, analysis)
        if cell.key in seen:
            raise ProbeError(
                f"{where}: cells {seen[cell.key]} and {cell.label!r} have the same configuration; "
                "a variant probably repeats a grid cell."
            )
        seen[cell.key] = cell.label
        cells.append(cell)
    return cells


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return "-".join(str(v) for v in value)
    return value.value if hasattr(value, "value") else value
