"""`Fields`: the one typed reader of an imported model's settings, a Hugging Face `config.json` or
a GGUF file's metadata. Every value the importer uses is read through it, so a string, a float,
a zero, a list or a bool where a count belongs is one line naming the file, the field and what
was expected, never a `ValueError` from `int()` or a `ZeroDivisionError` later.

In both formats an absent field and a null one mean "the default" (`n_inner: null`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, NoReturn

from probe.errors import ProbeError
from probe.fields import shown

REQUIRED = object()  # the `default` of a field that must be there


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


class Fields:
    """Typed reads of `data`; `label` names the source in messages ("/m/config.json",
    "GGUF file 'm.gguf': metadata") and `prefix` a nested mapping ("rope_scaling.")."""

    def __init__(self, data: Mapping[str, Any], label: str, prefix: str = "") -> None:
        self.data, self.label, self.prefix = data, label, prefix

    @classmethod
    def of(cls, hf: Mapping[str, Any] | Fields, where: str) -> Fields:
        """`hf` as Fields (a plain config dict is labelled by `where`)."""
        return hf if isinstance(hf, Fields) else cls(hf, f"{where}: config.json")

    # read like the dict it wraps, for code that only looks a key up
    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def fail(self, key: str, expected: str, value: Any) -> NoReturn:
        field = f"{self.prefix}{key}"
        raise ProbeError(f"{self.label}: {field} must be {expected}, got {shown(value)}.")

    def refuse(self, key: str, value: Any, why: str) -> NoReturn:
        """A well-typed value that asks for something probe does not implement."""
        raise ProbeError(f"{self.label}: {self.prefix}{key} = {value!r:.60}: {why}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        if value is None:
            if default is REQUIRED:
                raise ProbeError(f"{self.label} has no '{self.prefix}{key}' (it is required).")
            return default
        return value

    def integer(self, key: str, default: Any = REQUIRED, lo: int = 1, hi: int | None = None) -> int:
        """An integer in [lo, hi] (a bool, a float or a string is refused)."""
        value = self.raw(key, default)
        if value is default and default is not REQUIRED:
            return value
        in_range = _is_int(value) and value >= lo and (hi is None or value <= hi)
        if not in_range:
            if hi is not None:
                expected = f"an integer from {lo} to {hi}"
            else:
                expected = "a positive integer" if lo == 1 else f"an integer of at least {lo}"
            self.fail(key, expected, value)
        return int(value)

    def number(self, key: str, default: Any = REQUIRED, positive: bool = True) -> float:
        """A finite real number (an integer is fine), positive unless `positive=False`."""
        value = self.raw(key, default)
        if value is default and default is not REQUIRED:
            return value
        if not _is_number(value) or (positive and not value > 0):
            self.fail(key, "a positive number" if positive else "a finite number", value)
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def name(self, key: str, default: Any = REQUIRED) -> str:
        value = self.raw(key, default)
        if value is default and default is not REQUIRED:
            return value
        if not isinstance(value, str):
            self.fail(key, "a string", value)
        return value

    def choice(self, key: str, default: str, choices: Mapping[str, Any] | tuple, what: str) -> Any:
        """One of `choices` (a mapping: its value for the name); `what` names whom it is for."""
        value = self.name(key, default)
        if value not in choices:
            self.refuse(key, value, f"probe implements {', '.join(choices)} for {what}.")
        return choices[value] if isinstance(choices, Mapping) else value

    def section(self, key: str) -> Fields:
        """A nested mapping (null or absent: empty) read with the same rules."""
        value = self.raw(key, {})
        if not isinstance(value, Mapping):
            self.fail(key, "a mapping or null", value)
        return Fields(value, self.label, f"{self.prefix}{key}.")

    def divides(self, key: str, value: int, by_key: str, by_value: int) -> None:
        """Field `key`, read as the integer `value`, must be a multiple of field `by_key`, read as
        `by_value` (either may be the default of an absent field)."""
        if value % by_value:
            raise ProbeError(
                f"{self.label}: {self.prefix}{key} ({value}) must be a multiple of "
                f"{self.prefix}{by_key} ({by_value})."
            )
