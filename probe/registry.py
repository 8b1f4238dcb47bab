"""Named declarations: one `Registry` per kind of method (importance estimators, key/value-plan
methods, head-study step kinds), so a method is one module that declares itself.

A registry maps a name to a declaration (a frozen dataclass with a `name` field). Its entries
come from the modules of one package, each of which declares what it adds in a module-level
`DECLARES` (one declaration or a tuple of them); the package is read on first use, in module
name order, so importing a registry costs nothing until it is asked. A lookup of an unknown name
is one line with a suggestion and the choices, as lm-evaluation-harness's task registry answers:

    Unknown kv-plan method 'razr'. Did you mean 'razor'? Available: retrieval, razor, ...

Entries added by hand (`with registry.added(decl):`) last only for the block, so a test can add
a toy method and leave nothing behind.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from probe.errors import ProbeError
from probe.words import did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> declaration, for one kind of method (`what`: "kv-plan method")."""

    def __init__(self, what: str, package: str | None = None, *,
                 order: str | None = None) -> None:  # fmt: skip
        self.what = what
        self.package = package  # whose modules declare the entries (None: added by hand only)
        self.order = order  # a declaration field to sort by (else: the modules' name order)
        self._entries: dict[str, T] | None = None

    def _table(self) -> dict[str, T]:
        if self._entries is None:
            entries: dict[str, T] = {}
            for decl in _declared(self.package) if self.package else ():
                _put(entries, decl, self.what)
            if self.order:
                entries = dict(sorted(entries.items(), key=lambda kv: getattr(kv[1], self.order)))
            self._entries = entries
        return self._entries

    def get(self, name: Any) -> T:
        """The declaration called `name`, else one line with a suggestion and the choices."""
        table = self._table()
        if isinstance(name, str) and name in table:
            return table[name]
        raise ProbeError(self.unknown(name))

    def unknown(self, name: Any, what: str | None = None) -> str:
        """The line saying `name` is no entry ("Unknown kv-plan method 'x'. ...")."""
        names = self.names()
        return (f"Unknown {what or self.what} '{name}'.{did_you_mean(str(name), names)} "
                f"Available: {', '.join(names)}.")  # fmt: skip

    def find(self, name: Any) -> T | None:
        """The declaration called `name`, or None."""
        return self._table().get(name) if isinstance(name, str) else None

    def names(self) -> tuple[str, ...]:
        return tuple(self._table())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._table()

    def __iter__(self) -> Iterator[T]:
        return iter(tuple(self._table().values()))

    def __len__(self) -> int:
        return len(self._table())

    @contextmanager
    def added(self, *decls: T) -> Iterator[None]:
        """The registry with `decls` added for the block (a test's toy method), then without."""
        table = self._table()
        before = dict(table)
        try:
            for decl in decls:
                _put(table, decl, self.what)
            yield
        finally:
            table.clear()
            table.update(before)


def _put(entries: dict[str, Any], decl: Any, what: str) -> None:
    name = getattr(decl, "name", None)
    if not isinstance(name, str) or not name:
        raise ProbeError(f"a {what} declaration needs a name, got {decl!r}.")
    if name in entries:
        raise ProbeError(f"two {what}s are called '{name}'; give each its own name.")
    entries[name] = decl


def _declared(package: str) -> list[Any]:
    """Every declaration of the modules of `package` (their DECLARES), in module name order."""
    root = importlib.import_module(package)
    found: list[Any] = []
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package}.{info.name}")
        declared = getattr(module, "DECLARES", ())
        found += declared if isinstance(declared, tuple | list) else [declared]
    return found
