"""The two ways a command stops early: bad input (ProbeError) and the user's Ctrl-C (Interrupted);
and the optional packages a feature needs, asked for by name."""

from __future__ import annotations

import importlib
from types import ModuleType


class ProbeError(ValueError):
    """An error caused by user input; the CLI prints it as one line and exits with code 2."""


class Interrupted(BaseException):
    """The user stopped a command (Ctrl-C); the message says what was kept. A BaseException, like
    KeyboardInterrupt, so no `except Exception` swallows it. The CLI prints it and exits 130."""


# how to install each optional package a feature may need (the extras of pyproject.toml)
INSTALL = {
    "gguf": "pip install 'probe[gguf]' (or pip install 'gguf>=0.10')",
    "ray": "pip install 'probe[ray]' (or pip install ray)",
}


def optional(module: str, needed_for: str, then: str = "") -> ModuleType:
    """The optional package `module` (a key of INSTALL), imported; when it is not installed, one
    line saying what needs it and how to install it (a ProbeError, exit 2), never an
    ImportError's traceback. `then`: what else the user may do, appended."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ProbeError(f"{needed_for} needs the {module} package, which is not installed: "
                         f"{INSTALL[module]}{then}") from None  # fmt: skip
