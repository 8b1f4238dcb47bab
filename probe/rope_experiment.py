"""Rotary scaling as an experiment: any rotary model run, training-free, with a scaling it was not
trained with. What a user asks for (the `--rope-*` options, or a study's `rope_scaling` table)
is a kind and some of its parameters; the context a kind anchors at (yarn, llama3, longrope:
`original_max_position_embeddings`; dynamic: `max_position_embeddings`) defaults to the
context the model was trained at, which only the loaded checkpoint knows. So a request is
checked here before any model loads (torch-free: the command line answers at once), and
completed once the model's context is known (`complete`); `probe.model.rescale` applies it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from probe.config import PE, Arch, ModelConfig
from probe.data.task_spec import Form, TaskConfig, prompt_length, sequence_length
from probe.errors import ProbeError
from probe.rope import KINDS, RopeScaling, check_fields, check_kind
from probe.train_config import TrainConfig

# the context field each kind anchors at (filled from the model's training context if not given)
CONTEXT_FIELD = {
    "dynamic": "max_position_embeddings",
    "yarn": "original_max_position_embeddings",
    "llama3": "original_max_position_embeddings",
    "longrope": "original_max_position_embeddings",
}
# parameters a kind requires that have a customary value (Llama 3.1's), filled when not given
CUSTOMARY = {"llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0}}
_STAND_IN = 4096  # a context to check a request at before the model's is known


@dataclass(frozen=True)
class RopeRequest:
    """A rotary scaling asked for: its kind and the parameters given (Hugging Face key names,
    as `RopeScaling` has them); the kind's context may be left to the model."""

    kind: str
    given: tuple[tuple[str, Any], ...] = ()  # (parameter, value), in the order given

    def __post_init__(self) -> None:
        check_kind(self.kind)
        given = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in self.given)
        object.__setattr__(self, "given", given)  # frozen and hashable: lists as tuples
        self.complete(_STAND_IN)  # every other mistake, said as RopeScaling says it

    @classmethod
    def from_dict(cls, table: Any, where: str = "rope_scaling") -> RopeRequest:
        """A `rope_scaling` table ({kind = "linear", factor = 2.0}): unknown keys refused by
        name, every error prefixed with `where`."""
        if not isinstance(table, dict):
            raise ProbeError(
                f'{where} must be a table such as {{ kind = "linear", factor = 2.0 }}, got '
                f"{type(table).__name__}."
            )
        try:
            if "kind" not in table:
                spelt = next((k for k in ("rope_type", "type") if k in table), None)
                hint = f" (a Hugging Face section's '{spelt}' is 'kind' here)" if spelt else ""
                raise ProbeError(f"needs a kind ({', '.join(KINDS)}){hint}.")
            check_fields(table)
            rest = tuple((k, v) for k, v in table.items() if k != "kind")
            return cls(table["kind"], rest)
        except ProbeError as exc:
            raise ProbeError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """The table as given, JSON-ready (lists for the factor tables)."""
        given = {k: list(v) if isinstance(v, tuple) else v for k, v in self.given}
        return {"kind": self.kind, **given}

    def complete(self, context: int) -> RopeScaling:
        """The scaling itself, the kind's context taken as `context` where not given, and its
        customary parameters where not given."""
        values = {**CUSTOMARY.get(self.kind, {}), **dict(self.given)}
        anchor = CONTEXT_FIELD.get(self.kind)
        if anchor is not None and values.get(anchor) is None:
            values[anchor] = context
        if self._context_for_factor(values):  # yarn, longrope: factor = the context / original
            values["max_position_embeddings"] = context
        return RopeScaling.from_dict({"kind": self.kind, **values})

    def _context_for_factor(self, values: dict[str, Any]) -> bool:
        """Whether the kind takes its factor from the model's context (yarn and longrope
        without a factor) and none is given."""
        own = KINDS[self.kind].parameters
        missing = values.get("factor") is None and values.get("max_position_embeddings") is None
        return "max_position_embeddings" in own and "factor" in own and missing

    def filled(self) -> list[str]:
        """The parameters `complete` fills in (not given), for the note that says so."""
        given = dict(self.given)
        names = [n for n in CUSTOMARY.get(self.kind, {}) if n not in given]
        anchor = CONTEXT_FIELD.get(self.kind)
        names += [anchor] if anchor is not None and anchor not in given else []
        return names + (["max_position_embeddings"] if self._context_for_factor(given) else [])


def training_context(cfg: ModelConfig, task: TaskConfig | None,
                     train: TrainConfig | None) -> tuple[int, str]:  # fmt: skip
    """(the longest context the model was trained at, in positions; where that number comes
    from): an imported model's max_position_embeddings; a model trained here, the positions of
    its longest training example (randomized positions: the range they were drawn from)."""
    if task is None or train is None:
        return cfg.max_len, "the model's max_position_embeddings"
    if train.random_positions:
        return cfg.max_len, "the range its randomized training positions were drawn from"
    hi = train.train_len[1]
    if cfg.arch == Arch.ENCODER_DECODER:  # the source holds prompt + EOS, the target BOS + answer
        longest = max(prompt_length(task, hi) + 1, sequence_length(task, Form.ENCODER_DECODER, hi))
    else:
        longest = sequence_length(task, Form(str(cfg.arch)), hi)
    return longest, f"the positions of its longest training example (task length {hi})"


def check_rotary(cfg: ModelConfig | dict[str, Any], name: str,
                 asked: str = "the rotary scaling") -> None:  # fmt: skip
    """Refuse a scaling for a model without rotary positions (`cfg` a config or its dict);
    `asked` names what asked for it (an option, a study file's table)."""
    pe = cfg.get("pe", ModelConfig.pe) if isinstance(cfg, dict) else cfg.pe
    if str(pe) != PE.ROPE:
        raise ProbeError(
            f"{name} has {pe} positions, not rotary (pe 'rope'): there is no rotary scaling "
            f"to set; drop {asked}."
        )


def note(request: RopeRequest, scaling: RopeScaling, source: str) -> str:
    """One line saying what the model now runs with, and which values were filled in."""
    line = f"rotary scaling {scaling.describe()}, training-free"
    filled = request.filled()
    for context in dict.fromkeys((CONTEXT_FIELD.get(request.kind), "max_position_embeddings")):
        if context in filled:  # the model's context, where the kind needs one not given
            line += f"; {context} {getattr(scaling, context)} is {source}"
            filled.remove(context)
    if filled:
        line += f"; {', '.join(filled)} as Llama 3.1 has them"
    return line


def replaced(cfg: ModelConfig, scaling: RopeScaling) -> ModelConfig:
    """`cfg` with its (global) rotary layers scaled by `scaling`; refused in one line where it
    does not fit (no rotary, too few rotated dims for the kind, longrope tables' length)."""
    check_rotary(cfg, "the model")
    return dataclasses.replace(cfg, rope_scaling=scaling)
