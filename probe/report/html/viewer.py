"""The attention-head viewer: one self-contained HTML page (the data inlined as JSON, plain
JavaScript and SVG, nothing fetched, no script, stylesheet or font from elsewhere) showing a
model's heads as a layer x head grid and, for the head one clicks, its attention pattern on each
recorded example.

Data contract (what `viewer_html` takes; `validate_viewer_data` checks it and says what is wrong):

    {
      "title": str,                          # the page's heading and <title>
      "subtitle": str,                       # optional: one line under the title
      "layers": [                            # one entry per attention site, in model order
        {"name": "blocks.0.attn",            #   the site's module path, unique
         "heads": [0, 1, 2, 3]},             #   ORIGINAL ids of its heads (distinct, >= 0), pruned
      ],                                     #   ones included: they get a cell, drawn marked
      "statistics": {                        # at least one; the grid is coloured by the chosen one
        "normalized_entropy": {
          "label": "normalized entropy",     #   optional (default: the key); menu and legend text
          "values": [[0.81, 0.4, None, 0.9],  #   [layer][position in that layer's "heads"];
                     ...]},                  #   None (null), NaN: no value; a whole row may be None
      },
      "pruned": [[0, 2], ...],               # optional: [layer index, head id] of heads removed or
                                             #   masked: hatched grey cells, pattern panel "pruned"
      "examples": [                          # optional: the inputs the patterns were recorded on
        {"label": "length 8",                #   optional (default "example 1", ...)
         "tokens": ["<bos>", "a", ...],      #   n tokens: the labels of both axes
         "patterns": {                       #   any subset of heads; keys may be str or int
           "0": {"2": [[1.0, 0.0, ...],      #   [layer index][head id] -> n x n weights,
                       ...]}}},              #   [query row][key column]
      ],
      "provenance": {...},                   # optional: what the page depends on (versions,
                                             #   commit, device and dtype), inlined as given
    }

Row i of a pattern holds the weights query i puts on each key: within [0, 1], summing to 1 over
the keys it sees (within 1e-2), or all zeros (a query that sees nothing); a causal row holds zeros
after position i. Matrices may be nested lists or NumPy arrays. Weights are written rounded to
`decimals` places (default 5, so a row of 200 still sums to 1 within 1e-3).
"""

from __future__ import annotations

import difflib
import html
import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from probe.errors import ProbeError
from probe.files import atomic_write_text
from probe.report.html.viewer_page import PAGE, STYLE
from probe.report.html.viewer_script import SCRIPT
from probe.words import counted

__all__ = ["validate_viewer_data", "viewer_html", "write_viewer"]

ROW_SUM_TOLERANCE = 1e-2


def _fail(where: str, problem: str) -> NoReturn:
    raise ProbeError(f"viewer data: {where} {problem}")


def _keys(obj: Any, where: str, allowed: set[str], required: tuple[str, ...]) -> Mapping:
    if not isinstance(obj, Mapping):
        _fail(where, f"must be a dict with keys {sorted(allowed)}, got {type(obj).__name__}.")
    for key in obj:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            _fail(
                where, f"has an unknown key {key!r}.{hint} Allowed: {', '.join(sorted(allowed))}."
            )
    missing = [key for key in required if key not in obj]
    if missing:
        _fail(where, f"lacks {', '.join(map(repr, missing))} (required: {', '.join(required)}).")
    return obj


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(where, f"must be a non-empty string, got {value!r}.")
    return value


def _list(value: Any, where: str, what: str) -> list:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        _fail(where, f"must be a list of {what}, got {type(value).__name__}.")
    return list(value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"\d+", value):
        return int(value)  # JSON object keys are strings
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(where, f"must be a whole number, got {value!r}.")
    return int(value)


def _layers(raw: Any) -> list[dict]:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        _fail(
            "'layers'", "must be a non-empty list of {'name': ..., 'heads': [...]}, one per site."
        )
    layers: list[dict] = []
    for i, layer in enumerate(raw):
        where = f"layers[{i}]"
        _keys(layer, where, {"name", "heads"}, ("name", "heads"))
        name = _text(layer["name"], f"{where}.name")
        if any(seen["name"] == name for seen in layers):
            _fail(f"{where}.name", f"{name!r} repeats an earlier site's name; names are unique.")
        heads = [
            _int(h, f"{where}.heads[{j}]")
            for j, h in enumerate(_list(layer["heads"], f"{where}.heads", "head ids"))
        ]
        if not heads or min(heads) < 0 or len(set(heads)) != len(heads):
            _fail(f"{where}.heads", f"must be distinct original head ids >= 0, got {heads}.")
        layers.append({"name": name, "heads": heads})
    return layers


def _value(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(where, f"must be a number or None, got {value!r}.")
    value = float(value)
    return value if math.isfinite(value) else None


def _statistics(raw: Any, layers: list[dict]) -> dict[str, dict]:
    if not isinstance(raw, Mapping) or not raw:
        _fail(
            "'statistics'",
            "must be a non-empty dict name -> {'label': ..., 'values': ...}; "
            "the grid needs at least one statistic to colour the heads by.",
        )
    out: dict[str, dict] = {}
    for name, stat in raw.items():
        where = f"statistics[{name!r}]"
        _text(name, f"the key of {where}")
        _keys(stat, where, {"label", "values"}, ("values",))
        label = _text(stat.get("label", name.replace("_", " ")), f"{where}.label")
        rows = _list(stat["values"], f"{where}.values", "rows, one per layer")
        if len(rows) != len(layers):
            _fail(
                f"{where}.values",
                f"has {counted(len(rows), 'row')} but there are {counted(len(layers), 'layer')}; "
                "give one row per layer, in the order of 'layers'.",
            )
        values = []
        for i, (row, layer) in enumerate(zip(rows, layers, strict=True)):
            row = (
                [None] * len(layer["heads"])
                if row is None
                else _list(row, f"{where}.values[{i}]", "numbers")
            )
            if len(row) != len(layer["heads"]):
                _fail(
                    f"{where}.values[{i}]",
                    f"has {counted(len(row), 'value')} but {layer['name']} has "
                    f"{counted(len(layer['heads']), 'head')}; give one per id in "
                    f"layers[{i}].heads, in order.",
                )
            values.append([_value(v, f"{where}.values[{i}][{j}]") for j, v in enumerate(row)])
        out[name] = {"label": label, "values": values}
    return out


def _pruned(raw: Any, layers: list[dict]) -> list[list[int]]:
    pruned: list[list[int]] = []
    for i, pair in enumerate(_list(raw, "'pruned'", "[layer index, head id] pairs")):
        where = f"pruned[{i}]"
        pair = _list(pair, where, "two numbers: [layer index, head id]")
        if len(pair) != 2:
            _fail(where, f"must be [layer index, head id], got {pair!r}.")
        layer, head = _int(pair[0], f"{where}[0]"), _int(pair[1], f"{where}[1]")
        if not 0 <= layer < len(layers):
            _fail(
                where,
                f"names layer {layer}, but there {'is' if len(layers) == 1 else 'are'} "
                f"{counted(len(layers), 'layer')} (0..{len(layers) - 1}).",
            )
        if head not in layers[layer]["heads"]:
            _fail(
                where,
                f"names head {head}, which {layers[layer]['name']} does not list; list pruned "
                f"heads in layers[{layer}].heads too, so they get a (marked) cell.",
            )
        if [layer, head] not in pruned:
            pruned.append([layer, head])
    return pruned


def _pattern(raw: Any, where: str, n: int, decimals: int) -> list[list[float]]:
    try:
        weights = np.asarray(raw, dtype=float)
    except (TypeError, ValueError):
        _fail(where, f"must be an {n} x {n} list of numbers (query rows x key columns).")
    if weights.shape != (n, n):
        _fail(
            where,
            f"has shape {weights.shape}, expected ({n}, {n}): one row and one column per token.",
        )
    if not np.isfinite(weights).all() or weights.min() < -1e-6 or weights.max() > 1 + 1e-6:
        _fail(where, "holds weights outside [0, 1] (or NaN); give attention probabilities.")
    sums = weights.sum(axis=1)
    bad = np.flatnonzero((np.abs(sums - 1) > ROW_SUM_TOLERANCE) & (sums > 1e-9))
    if bad.size:
        row = int(bad[0])
        _fail(
            where,
            f"row {row} sums to {sums[row]:.4f}; each query row must sum to 1 over the keys "
            "it sees (or be all zeros).",
        )
    return np.round(np.clip(weights, 0.0, 1.0), decimals).tolist()


def _examples(raw: Any, layers: list[dict], decimals: int) -> list[dict]:
    examples = []
    for e, example in enumerate(_list(raw, "'examples'", "examples")):
        where = f"examples[{e}]"
        _keys(example, where, {"label", "tokens", "patterns"}, ("tokens", "patterns"))
        label = _text(example.get("label", f"example {e + 1}"), f"{where}.label")
        tokens = _list(example["tokens"], f"{where}.tokens", "token strings")
        if not tokens or not all(isinstance(t, str) for t in tokens):
            _fail(f"{where}.tokens", "must be a non-empty list of strings, one per position.")
        patterns = example["patterns"]
        if not isinstance(patterns, Mapping):
            _fail(f"{where}.patterns", "must be a dict {layer index: {head id: n x n weights}}.")
        out: dict[str, dict[str, list]] = {}
        for layer_key, heads in patterns.items():
            layer = _int(layer_key, f"a layer key of {where}.patterns")
            if not 0 <= layer < len(layers):
                _fail(
                    f"{where}.patterns",
                    f"names layer {layer}, but there {'is' if len(layers) == 1 else 'are'} "
                    f"{counted(len(layers), 'layer')}.",
                )
            if not isinstance(heads, Mapping):
                _fail(
                    f"{where}.patterns[{layer_key!r}]", "must be a dict {head id: n x n weights}."
                )
            for head_key, weights in heads.items():
                head = _int(head_key, f"a head key of {where}.patterns[{layer_key!r}]")
                if head not in layers[layer]["heads"]:
                    _fail(
                        f"{where}.patterns[{layer_key!r}]",
                        f"names head {head}, which "
                        f"{layers[layer]['name']} does not list (heads: {layers[layer]['heads']}).",
                    )
                cell = f"{where}.patterns[{layer_key!r}][{head_key!r}]"
                out.setdefault(str(layer), {})[str(head)] = _pattern(
                    weights, cell, len(tokens), decimals
                )
        examples.append({"label": label, "tokens": tokens, "patterns": out})
    return examples


def validate_viewer_data(data: Any, decimals: int = 5) -> dict:
    """A checked, JSON-ready copy of `data` (contract: the module docstring), or a ProbeError."""
    _keys(
        data,
        "the data",
        {"title", "subtitle", "layers", "statistics", "pruned", "examples", "provenance"},
        ("title", "layers", "statistics"),
    )
    layers = _layers(data["layers"])
    clean = {"title": _text(data["title"], "'title'"), "subtitle": "", "layers": layers}
    if data.get("subtitle") is not None:
        if not isinstance(data["subtitle"], str):
            _fail("'subtitle'", f"must be a string, got {type(data['subtitle']).__name__}.")
        clean["subtitle"] = data["subtitle"]
    clean["statistics"] = _statistics(data["statistics"], layers)
    clean["pruned"] = _pruned(data.get("pruned", []), layers)
    clean["examples"] = _examples(data.get("examples", []), layers, decimals)
    if data.get("provenance") is not None:  # what the page depends on: versions, device, dtype
        if not isinstance(data["provenance"], Mapping):
            _fail("'provenance'", f"must be a dict, got {type(data['provenance']).__name__}.")
        clean["provenance"] = json.loads(json.dumps(data["provenance"], default=str))
    return clean


def _script_json(obj: Any) -> str:
    """JSON safe inside <script type="application/json">: no `</script>` or `<!--` can form."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def viewer_html(data: Mapping[str, Any], decimals: int = 5) -> str:
    """The viewer page for `data` (contract in the module docstring) as one HTML string."""
    clean = validate_viewer_data(data, decimals)
    title = clean["title"].encode("utf-8", "replace").decode("utf-8")
    parts = {
        "TITLE": html.escape(title),
        "STYLE": STYLE,
        "SCRIPT": SCRIPT,
        "DATA": _script_json(clean),
    }
    return re.sub(r"@@(TITLE|STYLE|SCRIPT|DATA)@@", lambda m: parts[m.group(1)], PAGE)


def write_viewer(data: Mapping[str, Any], path: Path | str, decimals: int = 5) -> Path:
    """Write the viewer page to `path` atomically: a temporary file in the same folder, renamed."""
    path = Path(path)
    atomic_write_text(path, viewer_html(data, decimals))
    return path
