"""Reading and writing configuration fields.

Values arrive from JSON (checkpoints) and TOML (study files), so each is checked against its
dataclass field's declared type before the dataclass sees it: a bool is not an int, a float is
not an int (an int is a fine float), a float is finite, None only where the type says `| None`,
an enum field takes a string (its value is checked by `choice`), lists stand for tuples, a
nested setting (RopeScaling) a table. `from_dict` builds a config from such values, rejecting
unknown keys with a did-you-mean; `to_dict` writes one back, JSON-ready.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from enum import StrEnum
from typing import Any, TypeVar

from probe.errors import ProbeError
from probe.words import did_you_mean


class _Mismatch(Exception):
    """A value does not have the declared type (turned into a ProbeError naming the field)."""


def _conform(tp: Any, value: Any) -> Any:
    """`value` as a field of type `tp` holds it (lists become tuples), else _Mismatch."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        for arg in args:
            try:
                return _conform(arg, value)
            except _Mismatch:
                pass
    elif tp is type(None):
        if value is None:
            return value
    elif tp is bool or tp is str:
        if isinstance(value, tp):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if _finite_number(value):
            return value  # an int stays an int: configs hash their values as written
    elif isinstance(tp, type) and issubclass(tp, StrEnum):
        if isinstance(value, str):
            return value  # `choice` in __post_init__ checks it is one of the values
    elif origin is tuple:
        if isinstance(value, list | tuple):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_conform(args[0], v) for v in value)
            if len(value) == len(args):
                return tuple(_conform(a, v) for a, v in zip(args, value, strict=True))
    elif dataclasses.is_dataclass(tp):  # a nested setting (RopeScaling): its own from_dict
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return tp.from_dict(value)  # type: ignore[attr-defined]
    elif origin is dict or tp is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return value
    else:
        raise TypeError(f"no field check for type {tp!r}")  # a new field type: teach _conform
    raise _Mismatch


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _expected(tp: Any, plural: bool = False) -> str:
    """What type `tp` asks for, in words: 'an integer', 'a list of 2 integers', ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        parts = [_expected(a, plural) for a in args if a is not type(None)]
        return " or ".join(parts + (["null"] if type(None) in args else []))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"{'lists' if plural else 'a list'} of {_expected(args[0], plural=True)}"
        inner = _expected(args[0], plural=True) if len(set(args)) == 1 else "values"
        return f"{'lists' if plural else 'a list'} of {len(args)} {inner}"
    if dataclasses.is_dataclass(tp):
        return "tables" if plural else "a table"
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return f"one of {', '.join(m.value for m in tp)}"
    words = {
        bool: ("true or false", "booleans"),
        int: ("an integer", "integers"),
        float: ("a finite number", "finite numbers"),
        str: ("a string", "strings"),
        dict: ("a table", "tables"),
    }
    return words.get(origin or tp, ("anything", "anything"))[plural]


def shown(value: Any) -> str:
    """A value in an error message: short, with its type ('two' (str), null)."""
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:56] + " ..."
    return f"{text} ({type(value).__name__})"


def check_field(cls: type, name: str, value: Any, what: str) -> Any:
    """`value` for field `name` of dataclass `cls` (lists as tuples), or a ProbeError such as
    "model field 'n_head' must be an integer, got 'two' (str)." (`what` names the config)."""
    return field_value(typing.get_type_hints(cls)[name], name, value, what)


def field_value(tp: Any, name: str, value: Any, what: str) -> Any:
    """`value` as a field `name` of type `tp` holds it, or a ProbeError naming the field."""
    try:
        return _conform(tp, value)
    except ProbeError as e:  # a nested setting's own check (RopeScaling)
        raise ProbeError(f"{what} field '{name}': {e}") from None
    except _Mismatch:
        raise ProbeError(
            f"{what} field '{name}' must be {_expected(tp)}, got {shown(value)}."
        ) from None


E = TypeVar("E", bound=StrEnum)
C = TypeVar("C")


def choice(enum: type[E], value: Any, what: str, field: str = "") -> E:
    """Coerce `value` to `enum`, with an error that lists the valid values (and names the config
    field `field`, when given)."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        valid = [m.value for m in enum]
        named = f" (field '{field}')" if field else ""
        raise ProbeError(
            f"Unknown {what} '{value}'{named}.{did_you_mean(str(value), valid)} "
            f"Available: {', '.join(valid)}."
        ) from None


DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:\d+)?")  # what probe.runtime.resolve_device runs on


def check_device_name(name: Any, field: str = "device") -> str:
    """A device name by probe.runtime's rules (auto, cpu, cuda, cuda:N; mps where torch has it),
    checked as a name only: whether this machine has the device is asked when it is used."""
    if not isinstance(name, str) or not DEVICE_NAME.fullmatch(name.strip().lower()):
        raise ProbeError(f"Unknown {field} '{name!s:.60}'; use auto, cpu, cuda or cuda:N.")
    return name


def check_keys(table: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """`table` itself, once it is a dict whose keys are all in `allowed` (else a ProbeError
    naming `where`, the key and a suggestion)."""
    if not isinstance(table, dict):
        raise ProbeError(f"{where} must be a table, got {type(table).__name__}.")
    for key in table:
        if key not in allowed:
            raise ProbeError(
                f"{where}: unknown field '{key}'.{did_you_mean(key, list(allowed))} "
                f"Valid fields: {', '.join(allowed)}."
            )
    return table


def from_dict(cls: type[C], data: dict[str, Any], what: str) -> C:
    """Build dataclass `cls` from `data`, rejecting unknown keys and mistyped values by name."""
    if not isinstance(data, dict):
        raise ProbeError(f"{what} must be a table of settings, got {type(data).__name__}.")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            raise ProbeError(
                f"Unknown {what} field '{key}'.{did_you_mean(str(key), names)} "
                f"Valid fields: {', '.join(names)}."
            )
    hints = typing.get_type_hints(cls)
    return cls(**{key: field_value(hints[key], key, value, what) for key, value in data.items()})


def to_plain(value: Any) -> Any:
    """A config value as JSON has it: enums as strings, tuples as lists, nested settings
    (RopeScaling) as their to_dict."""
    if dataclasses.is_dataclass(value) and hasattr(value, "to_dict"):  # a nested setting
        return value.to_dict()
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_plain(x) for x in value]
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (enums as strings, tuples as lists)."""
    return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
