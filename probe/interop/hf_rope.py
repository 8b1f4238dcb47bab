"""Reading and writing a Hugging Face rotary section (`rope_scaling` in older configs,
`rope_parameters` in transformers 5): the kind under `rope_type` (or the older `type`) and its
own parameters, as a `probe.model.rope_kinds.RopeScaling`."""

from __future__ import annotations

from typing import Any

from probe.config import did_you_mean
from probe.errors import ProbeError
from probe.model.rope_kinds import KINDS, PARAMETERS, RopeScaling

ORIGINAL = "original_max_position_embeddings"
OLD_NAMES = {"su": "longrope"}  # kind names older transformers configs carry
MODEL_KEYS = ("rope_theta", "partial_rotary_factor")  # in a section, but the model's own
_SECTION_KEYS = tuple(p for p in PARAMETERS if p != "max_position_embeddings")


def rope_scaling_from_hf(
    section: dict[str, Any] | None,
    max_position_embeddings: int | None = None,
    original_max_position_embeddings: int | None = None,
) -> RopeScaling:
    """A Hugging Face `rope_scaling` / `rope_parameters` section (flat: one layer type's) as a
    RopeScaling. The kind is `rope_type` or the older `type`. The config's top-level
    `max_position_embeddings` and (Phi-3) `original_max_position_embeddings` come as arguments,
    the latter winning over the section's as in transformers. `rope_theta` and
    `partial_rotary_factor` are the model's base and rotated fraction, read with the model
    config, not here; any other key is refused, never dropped."""
    if section is None:
        return RopeScaling()
    if not isinstance(section, dict):
        raise ProbeError(f"a rotary scaling section must be a mapping, got {section!r}.")
    named = [section[k] for k in ("rope_type", "type") if section.get(k) is not None]
    if len(named) == 2 and named[0] != named[1]:
        raise ProbeError(f"rotary scaling has 'rope_type' {named[0]!r} and 'type' {named[1]!r}.")
    kind = named[0] if named else "default"
    kind = OLD_NAMES.get(kind, kind) if isinstance(kind, str) else kind
    values: dict[str, Any] = {}
    for key, value in section.items():
        if key not in ("rope_type", "type", *MODEL_KEYS, *_SECTION_KEYS):
            raise ProbeError(
                f"rotary scaling has key '{key}', which probe does not know."
                f"{did_you_mean(key, _SECTION_KEYS)} Known: {', '.join(_SECTION_KEYS)}."
            )
        if key in _SECTION_KEYS:
            values[key] = value
    own = KINDS[kind].required + KINDS[kind].optional if kind in KINDS else ()
    if original_max_position_embeddings is not None and ORIGINAL in own:
        values[ORIGINAL] = original_max_position_embeddings
    if max_position_embeddings is not None and "max_position_embeddings" in own:
        values["max_position_embeddings"] = max_position_embeddings
    return RopeScaling(kind=kind, **values)


def rope_scaling_to_hf(
    scaling: RopeScaling,
    rope_theta: float | None = None,
    partial_rotary_factor: float | None = None,
) -> dict[str, Any]:
    """The Hugging Face section of `scaling` in transformers 5.25's spelling (`rope_type`), with
    the model's `rope_theta` and `partial_rotary_factor` when given; `max_position_embeddings`
    belongs to the config's top level and is left out."""
    if not KINDS[scaling.kind].in_transformers:
        raise ProbeError(f"transformers has no rotary scaling kind '{scaling.kind}'.")
    section: dict[str, Any] = {"rope_type": scaling.kind}
    for name in _SECTION_KEYS:
        value = getattr(scaling, name)
        if value is not None or name in KINDS[scaling.kind].hf_null_keys:
            section[name] = list(value) if isinstance(value, tuple) else value
    for key, value in zip(MODEL_KEYS, (rope_theta, partial_rotary_factor), strict=True):
        if value is not None:
            section[key] = value
    return section
