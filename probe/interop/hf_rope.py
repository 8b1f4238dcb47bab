"""Reading and writing a Hugging Face rotary section (`rope_scaling` in older configs,
`rope_parameters` in transformers 5): the kind under `rope_type` (or the older `type`) and its
own parameters, as a `probe.rope.RopeScaling`; and `read_rotary` / `rotary_to_hf`, the one reader
and writer of a whole config's rotary settings (base, rotated fraction, scaling, one section per
layer type) that every family uses."""

from __future__ import annotations

from typing import Any

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.interop.family_parts import LAYER_TYPES  # the keys of a nested section
from probe.interop.fields import Fields
from probe.rope import KINDS, PARAMETERS, RopeScaling
from probe.words import did_you_mean

ORIGINAL = "original_max_position_embeddings"
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
    if kind in KINDS and not KINDS[kind].in_transformers:
        hf_kinds = [k for k, v in KINDS.items() if v.in_transformers]
        raise ProbeError(f"rotary scaling kind '{kind}' is probe's own: transformers has none, "
                         f"so a Hugging Face config cannot carry it (its kinds: "
                         f"{', '.join(hf_kinds)}).")  # fmt: skip
    values: dict[str, Any] = {}
    for key, value in section.items():
        if key not in ("rope_type", "type", *MODEL_KEYS, *_SECTION_KEYS):
            raise ProbeError(
                f"rotary scaling has key '{key}', which probe does not know."
                f"{did_you_mean(key, _SECTION_KEYS)} Known: {', '.join(_SECTION_KEYS)}."
            )
        if key in _SECTION_KEYS:
            values[key] = value
    own = KINDS[kind].parameters if kind in KINDS else ()
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


def _scaling(section: Fields, context: int | None, renamed: dict, original: Any) -> RopeScaling:
    """The RopeScaling of one flat section as transformers reads it (a kind name the family
    reads as another renamed; the context filled in), errors naming the file and the section.
    What transformers cannot load is refused: a null `rope_type` or `rope_theta`, and YaRN
    without its `factor` key (null: the model's context over the original)."""
    data = dict(section.data)
    for key in ("rope_type", "rope_theta"):
        if key in data and data[key] is None:
            section.fail(key, "a string" if key == "rope_type" else "a number", None)
    named = [section.name(k) for k in ("rope_type", "type") if section.has(k)]
    if len(set(named)) == 2:
        section.refuse("type", named[1], f"it disagrees with rope_type {named[0]!r}.")
    for key in ("rope_type", "type"):
        if data.get(key) in renamed:
            data[key] = renamed[data[key]]
    named = data.get("rope_type", data.get("type"))
    if named == "yarn" and "factor" not in data:
        section.refuse("rope_type", "yarn", "YaRN needs a 'factor' key (null: the model's "
                       "context over the original), as transformers requires.")  # fmt: skip
    if named in ("llama3", "yarn", "longrope") and original is None:  # as transformers fills it
        original = section.raw(ORIGINAL) or context
    try:
        return rope_scaling_from_hf(data, context, original)
    except ProbeError as e:
        raise ProbeError(f"{section.label}: {section.prefix.rstrip('.')}: {e}") from None


def _section(section: Fields, theta: float, context: int | None, how: dict[str, Any]):
    """(base, scaling) of one flat section, its `rope_theta` defaulting to `theta`. Where the
    family does not read a rotated fraction (`how["partial"]`), transformers' plain rotary
    ignores a `partial_rotary_factor` but its scaled kinds would shorten the frequencies by it:
    refused then."""
    base = section.number("rope_theta", theta)
    if not base > 1:
        section.fail("rope_theta", "a number greater than 1 (usually 10000)", base)
    scaling = _scaling(section, context, how["renamed"], how["top_original"])
    fraction = section.raw("partial_rotary_factor")
    if not (how["partial"] or scaling.plain or fraction is None or fraction == 1):
        section.refuse("partial_rotary_factor", fraction, "a scaled rotary on part of each head "
                       "is not implemented in probe for this family.")  # fmt: skip
    return base, scaling


def read_rotary(
    hf: Fields,
    context: int | None,
    *,
    theta: float = 10000.0,
    local_theta: float | None = None,
    renamed: dict[str, str] | None = None,
    top_original: int | None = None,
    nested: bool = False,
    partial: bool = False,
    slides: bool = True,
) -> dict[str, Any]:
    """A config's rotary settings as ModelConfig keywords (rope_base, rope_scaling and, where
    the config has one section per layer type, rope_local_base and rope_local_scaling), read
    as transformers 5.25 reads them (`context`: the model's max_position_embeddings, its
    default where the config has none): a non-empty `rope_scaling` replaces `rope_parameters` whole
    (a nested `rope_parameters` keeps its sliding section: then `rope_scaling` updates the full
    one, as Gemma 3 and OLMo-3 read it); the section's `rope_theta` wins over the top-level one,
    which wins over `theta`; the context a scaling anchors at is the section's, else the
    model's `max_position_embeddings`. `local_theta`: the sliding layers' default base in a
    nested config. `renamed`: kind names the family reads as others (Phi-3: yarn as longrope).
    `top_original`: the `original_max_position_embeddings` that wins over the section's (Phi-3:
    the config's, 4096 by default; elsewhere the top-level key where a flat config has one).
    `nested`: the family always has one section per layer type (Gemma 3, OLMo-3), absent ones
    the default; `slides`: whether a layer slides (without one the sliding section, read and
    checked all the same, is no layer's and is left out). The rotated fraction is the family's
    to read (`partial`: it does; elsewhere a section's `partial_rotary_factor` other than 1 is
    refused beside a scaled kind)."""
    theta = hf.number("rope_theta", theta)
    params = hf.section("rope_parameters")
    found = [k for k in LAYER_TYPES if k in params.data]
    scaling = hf.section("rope_scaling")
    if params.data and nested and not found:
        hf.fail("rope_parameters", f"a mapping of {' and '.join(LAYER_TYPES)}", params.data)
    if found and not nested:  # transformers ignores them (or fails): never read as one rotary
        hf.refuse("rope_parameters", sorted(params.data), "a rotary section per layer type; "
                  "this family has one rotary for every layer.")  # fmt: skip
    if top_original is None and not nested:  # a top-level one wins, as transformers reads it
        top_original = hf.integer(ORIGINAL, None)
    how = {"renamed": renamed or {}, "top_original": top_original, "partial": partial}
    if not (found or nested):
        section = scaling if scaling.data else params
        base, rope = _section(section, theta, context, how)
        return {"rope_base": base, "rope_scaling": rope}
    unknown = [k for k in params.data if k not in LAYER_TYPES]
    if unknown:
        params.refuse(unknown[0], params.data[unknown[0]], "a rotary section per layer type "
                      f"takes {' and '.join(LAYER_TYPES)}.")  # fmt: skip
    full = params.section("full_attention")
    if scaling.data:  # transformers updates the full-attention section with it
        full = Fields({**full.data, **scaling.data}, hf.label, "rope_scaling.")
    base, rope = _section(full, theta, context, how)
    local = params.section("sliding_attention")
    local_base, local_rope = _section(local, local_theta or theta, context, how)
    for section in (full, local):  # transformers reads truncate from the top only: always on
        if section.get("truncate") is False:
            section.refuse("truncate", False, "transformers reads YaRN's truncate only at the "
                           "top of rope_parameters, so a section per layer type always "
                           "truncates; remove the key to compute what it computes.")  # fmt: skip
    rotary = {"rope_base": base, "rope_scaling": rope}
    if slides:
        rotary |= {"rope_local_base": local_base, "rope_local_scaling": local_rope}
    return rotary


def rotary_to_hf(cfg: ModelConfig, fraction: bool = False, nested: bool = False) -> dict:
    """The `rope_parameters` of `cfg` as transformers 5.25 writes them: one flat section, or
    (`nested`, or where the config has a local rotary) one per layer type; `fraction`: with
    the rotated fraction in the section."""
    partial = cfg.rope_fraction if fraction else None
    full = rope_scaling_to_hf(cfg.rope_scaling, cfg.rope_base, partial)
    if not nested and cfg.rope_local_base is None:
        return full
    local_base = cfg.rope_base if cfg.rope_local_base is None else cfg.rope_local_base
    local = rope_scaling_to_hf(cfg.rope_local_scaling, local_base, partial)
    return {"full_attention": full, "sliding_attention": local}
