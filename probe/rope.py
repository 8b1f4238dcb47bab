"""Rotary scaling kinds: one table, `KINDS`, from a kind's name to the function that gives its
frequencies and attention factor, computed exactly as transformers 5.25 computes them
(`ROPE_INIT_FUNCTIONS` in `transformers/modeling_rope_utils.py`), operation for operation, so
the float32 results are bit-identical; plus static NTK-aware scaling, which transformers lacks.

Every function is `(base, dims, scaling, length) -> (inv_freq [dims/2] float32, attention_factor)`:
`dims` the rotated dimensions of a head, `length` the current length (max position + 1; None at
load time). The model multiplies cos and sin by the attention factor, so logits scale by its
square. A new kind is one `RopeKind` entry in `KINDS`.

`RopeScaling` holds a kind and its own parameters, named as in a Hugging Face `rope_scaling` /
`rope_parameters` section (`probe.interop.hf_rope` reads and writes those); `ModelConfig` holds
one per layer type. This module is configuration: it imports torch only when frequencies are
computed, so a configuration is checked (and the command line answers) without loading torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError
from probe.fields import to_plain
from probe.words import did_you_mean

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RopeScaling:
    """A rotary scaling kind and its parameters; a parameter left None takes transformers'
    default. Field names are the Hugging Face section's keys."""

    kind: str = "default"  # a key of KINDS
    factor: float | None = None  # how many times longer the context is made (s)
    # the context the model was pre-trained at (L), where yarn, llama3 and longrope anchor
    original_max_position_embeddings: int | None = None
    # the model's own context (Hugging Face's top-level key, never in the section): dynamic
    # scales from it; longrope and yarn without a factor take max / original as theirs
    max_position_embeddings: int | None = None
    low_freq_factor: float | None = None  # llama3: wavelengths above L / this are divided by s
    high_freq_factor: float | None = None  # llama3: wavelengths below L / this are kept
    beta_fast: float | None = None  # yarn: rotations in L below which a pair interpolates (32)
    beta_slow: float | None = None  # yarn: rotations in L above which a pair extrapolates (1)
    mscale: float | None = None  # yarn: with mscale_all_dim, the numerator of the attention factor
    mscale_all_dim: float | None = None  # yarn: its denominator (DeepSeek)
    attention_factor: float | None = None  # yarn, longrope: overrides the computed one
    truncate: bool | None = None  # yarn: round the ramp's ends to whole pairs (True)
    short_factor: tuple[float, ...] | None = None  # longrope: per-pair divisors up to L
    long_factor: tuple[float, ...] | None = None  # longrope: per-pair divisors past L
    alpha: float | None = None  # ntk: base' = base * alpha ** (d / (d - 2))

    def __post_init__(self) -> None:
        check_kind(self.kind)
        for name, (valid, wanted) in _RULES.items():
            value = getattr(self, name)
            if value is not None and not valid(value):
                raise ProbeError(f"rotary scaling '{name}' must be {wanted}, got {value!r}.")
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))  # frozen, hashable
        kind = KINDS[self.kind]
        own = kind.parameters
        for name in PARAMETERS:
            if getattr(self, name) is not None and name not in own:
                raise ProbeError(
                    f"rotary scaling kind '{self.kind}' has no parameter '{name}' "
                    f"(its parameters: {', '.join(own) or 'none'})."
                )
        for name in kind.required:
            if getattr(self, name) is None:
                raise ProbeError(
                    f"rotary scaling kind '{self.kind}' needs '{name}'; it is missing."
                )
        if kind.check is not None:
            kind.check(self)

    @property
    def plain(self) -> bool:
        """Whether this is the unscaled rotary embedding (kind default)."""
        return self.kind == "default"

    @property
    def by_length(self) -> bool:
        """Whether the frequencies depend on the input's length (dynamic, longrope)."""
        return KINDS[self.kind].by_length

    def check_dims(self, dims: int) -> None:
        """Refuse parameters that do not fit heads rotating `dims` dimensions."""
        for name in ("short_factor", "long_factor"):
            given = getattr(self, name)
            if given is not None and len(given) != _pairs(dims):
                raise ProbeError(
                    f"rotary scaling '{name}' has {len(given)} entries; {dims} rotated dims "
                    f"need {_pairs(dims)}, one per pair."
                )
        if self.kind in ("dynamic", "ntk") and dims <= 2:
            raise ProbeError(
                f"rotary scaling kind '{self.kind}' needs more than 2 rotated dims, got {dims}."
            )

    def describe(self) -> str:
        """The kind and its parameters in a line: "llama3 (factor 8.0, low_freq_factor 1.0,
        ...)"; long factor tables shortened to their length."""
        given = list(self.to_dict().items())[1:]  # after the kind
        shown = [f"{k} {f'[{len(v)} values]' if isinstance(v, list) else v}" for k, v in given]
        return f"{self.kind} ({', '.join(shown)})" if shown else self.kind

    def to_dict(self) -> dict[str, Any]:
        """The kind and the parameters set, JSON-ready (lists for the factor tables)."""
        given = {k: getattr(self, k) for k in PARAMETERS if getattr(self, k) is not None}
        return {"kind": self.kind, **{k: to_plain(v) for k, v in given.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RopeScaling:
        """The inverse of to_dict: unknown keys refused by name."""
        if not isinstance(data, dict):
            raise ProbeError(f"a rotary scaling must be a table, got {type(data).__name__}.")
        check_fields(data)
        return cls(**data)

    def resolved_factor(self) -> float:
        """`factor`, or (longrope, yarn) the model's context over the original one."""
        if self.factor is not None:
            return self.factor
        return self.max_position_embeddings / self.original_max_position_embeddings


def check_kind(kind: Any) -> None:
    """Refuse a kind that is not in KINDS, listing those that are."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise ProbeError(
            f"Unknown rotary scaling kind '{kind}' (field 'kind')."
            f"{did_you_mean(str(kind), list(KINDS))} Available: {', '.join(KINDS)}."
        )


def check_fields(data: dict[str, Any]) -> None:
    """Refuse a key of a rotary scaling table that is neither 'kind' nor a parameter."""
    known = ("kind", *PARAMETERS)
    for key in data:
        if key not in known:
            raise ProbeError(
                f"rotary scaling has no field '{key}'.{did_you_mean(str(key), known)} "
                f"Fields: {', '.join(known)}."
            )


def _number(value: Any, low: float = 0.0) -> bool:
    """A finite number (not a bool) above `low`."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return ok and math.isfinite(value) and value > low


def _numbers(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(_number(x) for x in value)


_POSITIVE = (_number, "a finite number > 0")
_COUNT = (lambda v: type(v) is int and v > 0, "a whole number > 0")
_WEIGHT = (lambda v: _number(v, -1.0) and v >= 0, "a finite number >= 0")
# field -> (whether a value is valid, what is wanted); the kind is checked apart
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "factor": _POSITIVE,
    "original_max_position_embeddings": _COUNT,
    "max_position_embeddings": _COUNT,
    "low_freq_factor": _POSITIVE,
    "high_freq_factor": _POSITIVE,
    "beta_fast": _POSITIVE,
    "beta_slow": _POSITIVE,
    "mscale": _WEIGHT,
    "mscale_all_dim": _WEIGHT,
    "attention_factor": _POSITIVE,
    "truncate": (lambda v: isinstance(v, bool), "true or false"),
    "short_factor": (_numbers, "a list of finite numbers > 0"),
    "long_factor": (_numbers, "a list of finite numbers > 0"),
    "alpha": _POSITIVE,
}
PARAMETERS = tuple(f.name for f in dataclasses.fields(RopeScaling) if f.name != "kind")
Freqs = tuple["torch.Tensor", float]  # (inv_freq [pairs] float32, attention factor)


def _pairs(dims: int) -> int:
    """The rotated pairs of `dims` dimensions, as transformers counts them (arange(0, dims, 2))."""
    return (dims + 1) // 2


def _inv_freq(base: float | torch.Tensor, dims: int) -> torch.Tensor:
    """θ_i = 1 / base^(2i/d), rounded as transformers rounds it: the exponent 2i/d in float32
    first, then the power, then the reciprocal (base^(-i/(d/2)) is one rounding apart)."""
    import torch

    exponent = torch.arange(0, dims, 2, dtype=torch.int64).to(torch.float32) / dims  # [pairs]
    return 1.0 / (base**exponent)  # [pairs]


def _default(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    return _inv_freq(base, dims), 1.0


def _linear(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    """Position interpolation (Chen et al. 2023): positions / s, as frequencies / s."""
    return _inv_freq(base, dims) / s.factor, 1.0  # [pairs]


def _ntk_exponent(dims: int, kind: str) -> float:
    if dims <= 2:
        raise ProbeError(
            f"rotary scaling kind '{kind}' needs more than 2 rotated dims, got {dims}."
        )
    return dims / (dims - 2)


def _dynamic(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    """Dynamic NTK: base' = base * (s * n / L - (s - 1)) ** (d / (d - 2)), n = max(length, L),
    L the model's context. Up to L transformers keeps its load-time frequencies (computed in
    Python floats); past L it recomputes them from the length as a 0-d tensor, so base' is
    rounded to float32 on the way. Both are followed here. (A transformers module also keeps
    the frequencies of the longest input it saw until one shorter than L comes; a function of
    the current length cannot, so a caller that wants that keeps the longest length itself.)"""
    import torch

    factor, context, exponent = s.factor, s.max_position_embeddings, _ntk_exponent(dims, s.kind)
    if length is None or length <= context:
        new_base = base * ((factor * context / context) - (factor - 1)) ** exponent
    else:
        n = torch.tensor(length, dtype=torch.int64)  # max(position_ids) + 1, as transformers has it
        new_base = base * ((factor * n / context) - (factor - 1)) ** exponent  # 0-d float32
    return _inv_freq(new_base, dims), 1.0


def _ntk(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    """Static NTK-aware scaling (bloc97): base' = base * alpha ** (d / (d - 2))."""
    return _inv_freq(base * s.alpha ** _ntk_exponent(dims, s.kind), dims), 1.0


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor, eq. 21: 0.1 * mscale * ln(s) + 1 (1 when s <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    """YaRN (Peng et al. 2023), "NTK-by-parts": the pairs turning more than beta_fast times in
    L keep θ_i, those turning fewer than beta_slow times take θ_i / s, a linear ramp between;
    attention factor 0.1 ln s + 1, or (DeepSeek) mscale's over mscale_all_dim's."""
    import torch

    factor, original = s.resolved_factor(), s.original_max_position_embeddings
    attention = s.attention_factor
    if attention is None and s.mscale and s.mscale_all_dim:
        attention = float(_yarn_mscale(factor, s.mscale) / _yarn_mscale(factor, s.mscale_all_dim))
    elif attention is None:
        attention = _yarn_mscale(factor)

    def pair_turning(rotations: float) -> float:  # the (fractional) pair turning so often in L
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = pair_turning(s.beta_fast or 32), pair_turning(s.beta_slow or 1)
    if s.truncate is None or s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    kept = 1 - ramp  # [pairs] the share of each pair that keeps θ_i
    powers = base ** (torch.arange(0, dims, 2).to(torch.float32) / dims)  # [pairs] 1 / θ_i
    inv_freq = (1.0 / (factor * powers)) * (1 - kept) + (1.0 / powers) * kept  # [pairs]
    return inv_freq, attention


def _yarn_check(s: RopeScaling) -> None:
    _factor_or_context(s)
    if (s.beta_fast or 32) <= (s.beta_slow or 1):
        raise ProbeError(
            f"rotary scaling 'beta_fast' ({s.beta_fast or 32}) must be greater than "
            f"'beta_slow' ({s.beta_slow or 1})."
        )


def _factor_or_context(s: RopeScaling) -> None:
    if s.factor is None and s.max_position_embeddings is None:
        raise ProbeError(
            f"rotary scaling kind '{s.kind}' needs 'factor' (or the model's "
            "'max_position_embeddings', to divide by the original); it is missing."
        )


def _llama3(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    """Llama 3.1: wavelengths 2π/θ_i below L / high_freq_factor are kept, those above
    L / low_freq_factor divided by s, smoothly interpolated between."""
    import torch

    factor, low, high = s.factor, s.low_freq_factor, s.high_freq_factor
    original = s.original_max_position_embeddings
    inv_freq = _inv_freq(base, dims)  # [pairs]
    wavelength = 2 * math.pi / inv_freq  # [pairs]
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)  # [pairs]
    smooth = (original / wavelength - low) / (high - low)  # [pairs]
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled  # [pairs]
    medium = ~(wavelength < original / high) * ~(wavelength > original / low)  # [pairs]
    return torch.where(medium, smoothed, scaled), 1.0


def _llama3_check(s: RopeScaling) -> None:
    if s.high_freq_factor <= s.low_freq_factor:
        raise ProbeError(
            f"rotary scaling 'high_freq_factor' ({s.high_freq_factor}) must be greater than "
            f"'low_freq_factor' ({s.low_freq_factor})."
        )


def _longrope(base: float, dims: int, s: RopeScaling, length: int | None) -> Freqs:
    """LongRoPE (Phi-3): θ_i / λ_i, λ the short factors up to L and the long ones past it (one
    table for the whole sequence); attention factor sqrt(1 + ln s / ln L)."""
    import torch

    s.check_dims(dims)
    factor, original = s.resolved_factor(), s.original_max_position_embeddings
    attention = s.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    long = length is not None and length > original
    divisors = torch.tensor(s.long_factor if long else s.short_factor, dtype=torch.float32)
    exponent = torch.arange(0, dims, 2, dtype=torch.int64).float() / dims  # [pairs]
    return 1.0 / (divisors * base**exponent), attention  # [pairs]


def _longrope_check(s: RopeScaling) -> None:
    _factor_or_context(s)
    if len(s.short_factor) != len(s.long_factor):
        raise ProbeError(
            f"rotary scaling 'long_factor' has {len(s.long_factor)} entries and 'short_factor' "
            f"{len(s.short_factor)}; both need one per rotated pair."
        )


@dataclass(frozen=True)
class RopeKind:
    """One rotary kind: its frequency function and the RopeScaling fields it reads."""

    # (base, dims, scaling, length) -> (inv_freq [pairs], attention factor)
    frequencies: Callable[[float, int, RopeScaling, int | None], Freqs]
    required: tuple[str, ...] = ()  # fields it cannot go without
    optional: tuple[str, ...] = ()  # fields with a default
    check: Callable[[RopeScaling], None] | None = None  # what its fields must satisfy together
    in_transformers: bool = True  # whether a Hugging Face config can carry it
    by_length: bool = False  # whether its frequencies depend on the current length
    # keys transformers requires in a section even when null (then derived), written so
    hf_null_keys: tuple[str, ...] = ()

    @property
    def parameters(self) -> tuple[str, ...]:
        """Every RopeScaling field it reads, required or not."""
        return self.required + self.optional

    def __call__(
        self, base: float, dims: int, scaling: RopeScaling, length: int | None = None
    ) -> Freqs:
        """The frequencies and attention factor; parameters so extreme that they overflow or
        give frequencies that are not finite and positive (a factor of 1e-300) are refused in
        one line rather than turning every logit into NaN."""
        try:
            inv_freq, attention = self.frequencies(base, dims, scaling, length)
        except (OverflowError, ZeroDivisionError):
            inv_freq, attention = None, math.nan
        finite = inv_freq is not None and (
            inv_freq.is_meta or bool(inv_freq.isfinite().all() and (inv_freq > 0).all())
        )  # (a model built on the meta device has no values to check yet)
        if not (finite and math.isfinite(attention) and attention > 0):
            raise ProbeError(
                f"rotary scaling {scaling.describe()} gives frequencies that are not finite "
                "numbers (a parameter far out of range); choose a factor nearer 1."
            )
        return inv_freq, attention


_L = "original_max_position_embeddings"
_YARN = ("factor", "max_position_embeddings", "beta_fast", "beta_slow", "mscale")
_YARN += ("mscale_all_dim", "attention_factor", "truncate")
KINDS: dict[str, RopeKind] = {
    "default": RopeKind(_default),
    "linear": RopeKind(_linear, ("factor",)),
    "dynamic": RopeKind(_dynamic, ("factor", "max_position_embeddings"), by_length=True),
    "yarn": RopeKind(_yarn, (_L,), _YARN, _yarn_check, hf_null_keys=("factor",)),
    "llama3": RopeKind(
        _llama3, ("factor", "low_freq_factor", "high_freq_factor", _L), (), _llama3_check
    ),
    "longrope": RopeKind(
        _longrope,
        ("short_factor", "long_factor", _L),
        ("factor", "max_position_embeddings", "attention_factor"),
        _longrope_check,
        by_length=True,
    ),
    "ntk": RopeKind(_ntk, ("alpha",), in_transformers=False),
}
UNSCALED = RopeScaling()  # the plain rotary embedding: kind default, no parameters
