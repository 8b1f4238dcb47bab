"""A method's options: a frozen dataclass whose fields carry their bounds and help.

    @dataclass(frozen=True)
    class RazorOptions:
        period: int = option(64, low=2, help="tokens repeated for echo and induction")

One declaration serves every way options arrive: a study file's table (`read`), a command's
`--set key=value` (`parse_sets`), keyword arguments from Python (`check`); the bounds are
checked in one place with one message, and help text is written from the same fields
(`describe`). A number must be finite, a bound holds for each entry of a tuple field, and a
tuple lists each value once. `high` may be a callable (a bound known only on the machine: its
CPU count).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from probe.errors import ProbeError
from probe.fields import field_value, from_dict
from probe.words import did_you_mean

C = TypeVar("C")
Bound = float | Callable[[], float] | None


def option(default: Any, *, low: float | None = None, high: Bound = None, help: str = "") -> Any:
    """A dataclass field with its default, bounds (inclusive) and help."""
    return dataclasses.field(default=default,
                             metadata={"low": low, "high": high, "help": help})  # fmt: skip


def bounds(cls_or_obj: Any) -> dict[str, tuple[float | None, Bound, str]]:
    """Field name -> (low, high, help) of every field that declares a bound or help."""
    return {f.name: (f.metadata.get("low"), f.metadata.get("high"), f.metadata.get("help", ""))
            for f in dataclasses.fields(cls_or_obj) if f.metadata}  # fmt: skip


def _span(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {low:g}"
    if low is None:
        return f"at most {high:g}"
    if isinstance(high, int):
        return f"at least {low:g} and at most {high:,}"
    return f"from {low:g} to {high:g}"


def check(obj: C, where: str = "", *, flags: bool = False) -> C:
    """`obj` itself once every bounded field is within its bounds and no tuple field repeats a
    value, else one line: "<where> <name> must be at least 2 (tokens repeated), got 1."
    (`flags`: name the field as a command's option, --name)."""
    for name, (low, high, what) in bounds(obj).items():
        value = getattr(obj, name)
        shown = f"--{name.replace('_', '-')}" if flags else name
        prefix = f"{where} {shown}" if where else shown
        high = high() if callable(high) else high
        about = f" ({what})" if what else ""
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if not math.isfinite(v):
                raise ProbeError(f"{prefix} must be a finite number{about}, got {v!r}.")
            if (low is not None and v < low) or (high is not None and v > high):
                raise ProbeError(f"{prefix} must be {_span(low, high)}{about}, got {v!r}.")
        if isinstance(value, tuple) and len(set(value)) < len(value):
            raise ProbeError(f"{prefix} lists a value twice: {list(value)}.")
    return obj


def read(cls: type[C], table: dict[str, Any], what: str, where: str = "") -> C:
    """`cls` from a study file's table: unknown keys and mistyped values refused by name
    (`what`: "[kv] razor"), then the bounds (`where`: the file and section)."""
    return check(from_dict(cls, table, what), where)


def parse_sets(cls: type, items: Iterable[str], what: str) -> dict[str, Any]:
    """Field values from `--set key=value` strings, each value read as a TOML value (a bare word
    is a string; `1,2` a list), typed and named as in a study file."""
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ProbeError(f"--set takes key=value, got '{item}'.")
        if key not in names:
            valid = ", ".join(names) or "none"
            raise ProbeError(f"Unknown {what} option '{key}'.{did_you_mean(key, names)} "
                             f"Valid options: {valid}.")  # fmt: skip
        values[key] = field_value(hints[key], key, _toml_value(text.strip()), what)
    return values


def _toml_value(text: str) -> Any:
    bare_list = "," in text and not text.startswith("[")
    for candidate in (text, f"[{text}]") if bare_list else (text,):
        try:
            return tomllib.loads(f"v = {candidate}")["v"]
        except tomllib.TOMLDecodeError:
            pass
    return text  # a bare word: a string


def describe(cls: type) -> str:
    """One line per option: "period = 64 (at least 2): tokens repeated for echo and induction"."""
    lines = []
    for f in dataclasses.fields(cls):
        low, high, what = f.metadata.get("low"), f.metadata.get("high"), f.metadata.get("help", "")
        high = None if callable(high) else high
        span = f" ({_span(low, high)})" if low is not None or high is not None else ""
        lines.append(f"{f.name} = {f.default!r}{span}{': ' + what if what else ''}")
    return "\n".join(lines)
