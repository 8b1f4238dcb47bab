"""Reading a study's documents: study files (TOML) and the JSON a run leaves behind (study.json,
manifest.json, done.json). Every failure is one line naming the file: missing, a folder, not
UTF-8, not valid TOML or JSON, or nested too deeply to read."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.files import check_input_file


def _text(path: Path, kind: str) -> str:
    check_input_file(path, f"a {kind} file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProbeError(
            f"{path} is not a text file: byte {exc.object[exc.start]:#04x} at offset {exc.start} "
            f"is not UTF-8; a {kind} file is text."
        ) from None
    except IsADirectoryError:
        raise ProbeError(f"'{path}' is a folder, not a {kind} file.") from None
    except OSError as exc:
        raise ProbeError(f"{path} cannot be read: {exc.strerror or exc}.") from None


def _too_deep(path: Path, kind: str) -> ProbeError:
    return ProbeError(
        f"{path} nests its tables or lists too deeply to read (Python's recursion limit); it "
        f"is not a {kind} file probe wrote or reads."
    )


def read_toml(path: str | Path) -> dict[str, Any]:
    """A study file's contents, with one-line errors for a missing or unreadable file."""
    path = Path(path)
    if not path.exists():
        raise ProbeError(f"No study file at '{path}'. List the shipped ones with `probe study ls`.")
    if path.is_dir():
        raise ProbeError(
            f"'{path}' is a folder; give a study file in it (`probe study ls {path}`)."
        )
    text = _text(path, "study (TOML)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProbeError(f"{path} is not valid TOML: {exc}.") from None
    except RecursionError:
        raise _too_deep(path, "study (TOML)") from None


def read_json(path: str | Path) -> Any:
    """A JSON document, with one-line errors naming the file."""
    path = Path(path)
    if not path.exists():
        raise ProbeError(f"No file at '{path}'.")
    text = _text(path, "JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"{path} is not valid JSON: {exc}.") from None
    except RecursionError:
        raise _too_deep(path, "JSON") from None
