"""A checkpoint directory by its files: their names and its config.json, read with clear errors.

No torch here (`probe.checkpoint` loads the model): the command line checks a checkpoint it is
given, missing, a file, not a probe checkpoint, before it imports torch or loads anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.files import check_input_file

FORMAT = "probe-checkpoint"
FORMAT_VERSION = 1
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARDS = "model-*-of-*.safetensors"  # every shard's name matches this pattern
METRICS = "metrics.csv"
TOKENIZER = "tokenizer.json"
# what an imported model is evaluated by on text (probe.interop.importer.Objective names them)
OBJECTIVES = ("causal-lm", "masked-lm", "embedding")
# the files a checkpoint may hold (SHARDS is a pattern: `claim_output` finds every shard)
CHECKPOINT_FILES = (WEIGHTS, INDEX, SHARDS, CONFIG, METRICS, TOKENIZER)


def read_config(path: str | Path) -> dict[str, Any]:
    """The parsed config.json of a checkpoint directory (or of the directory of the config.json
    or weights file given), with clear errors."""
    path = Path(path)
    if not path.exists():
        raise ProbeError(f"No checkpoint at '{path}': the path does not exist.")
    if path.is_file():
        if path.name in (CONFIG, WEIGHTS, INDEX):
            path = path.parent
        else:
            raise ProbeError(
                f"'{path}' is a file; a probe checkpoint is a directory holding {WEIGHTS} "
                f"and {CONFIG}."
            )
    config_file = path / CONFIG
    if not config_file.exists():
        raise ProbeError(f"'{path}' is not a probe checkpoint: {CONFIG} is missing.")
    check_input_file(config_file, f"the checkpoint's {CONFIG} (a JSON file)")
    try:
        document = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProbeError(
            f"{config_file} is not valid JSON ({exc}); the checkpoint is corrupt."
        ) from None
    except RecursionError:
        raise ProbeError(
            f"{config_file} nests JSON arrays or objects too deeply to read; the checkpoint is "
            "corrupt."
        ) from None
    except OSError as exc:
        raise ProbeError(f"{config_file} cannot be read: {exc.strerror or exc}.") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ProbeError(f"{config_file} is not a probe checkpoint config (no format '{FORMAT}').")
    imported = isinstance(document.get("source"), dict)
    for key in ("model",) if imported else ("model", "task", "train"):
        if not isinstance(document.get(key), dict):
            raise ProbeError(f"{config_file} has no '{key}' section; the checkpoint is corrupt.")
    if imported and document["source"].get("objective") not in OBJECTIVES:
        raise ProbeError(
            f"{config_file}: source.objective must be one of {', '.join(OBJECTIVES)}, got "
            f"{document['source'].get('objective')!r:.60} (the file was edited or damaged; "
            "import the model again)."
        )
    return document
