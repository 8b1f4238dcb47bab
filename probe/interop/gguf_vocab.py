"""The vocabulary a GGUF file stores, read under llama.cpp's key names (`tokenizer.ggml.*`).

Shared by the two tokenizers probe rebuilds from a GGUF: byte-level BPE (`tokenizer.py`,
`tokenizer.ggml.model == "gpt2"`) and SentencePiece (`tokenizer_spm.py`, `"llama"`). Every value
is read through `Fields`, so a damaged file is one line naming the file and the key.
"""

from __future__ import annotations

import numbers
from typing import Any

from probe.errors import ProbeError
from probe.interop.fields import Fields

KEY = "tokenizer.ggml."

# GGUF token types (llama.cpp `llama_token_type`)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def required(meta: Fields, name: str) -> str:
    """The key `tokenizer.ggml.<name>`, refused when the file lacks it."""
    key = KEY + name
    if not meta.has(key):
        raise ProbeError(
            f"{meta.label} has no '{key}': the file carries no tokenizer probe can rebuild; "
            "use the model's tokenizer.json instead."
        )
    return key


def strings(meta: Fields, key: str) -> list[str]:
    """An array of strings (the tokens, the merges)."""
    value = meta.raw(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        meta.fail(key, "a list of strings", value)
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def per_token(meta: Fields, name: str, n_tokens: int, default: Any, ok, kind: str, noun: str
              ) -> list:  # fmt: skip
    """`tokenizer.ggml.<name>`: one value per token, each a `kind` (`ok(value)`), or `default` for
    every token when the file has none; `noun` names the values in messages."""
    key = KEY + name
    values = meta.raw(key, [default] * n_tokens)
    if not isinstance(values, list) or not all(ok(v) for v in values):
        meta.fail(key, f"a list of {kind}", values)
    if len(values) != n_tokens:
        raise ProbeError(
            f"{meta.label}: {key} lists {len(values)} {noun} but {KEY}tokens {n_tokens} tokens; "
            "the file is damaged: download it again."
        )
    return values


def token_types(meta: Fields, n_tokens: int) -> list[int]:
    """Each token's type (NORMAL when the file lists none)."""
    return per_token(meta, "token_type", n_tokens, NORMAL, is_int, "integers", "token types")


def end_token(
    meta: Fields, end: str, tokens: list[str], add: bool = False, index: int | None = None
) -> tuple[str, int] | None:
    """(token, id) of BOS or EOS (`end`) when the file asks for it to be added, else None.

    `add` is what a file that does not say (`add_bos_token`) means, `index` the id a file without
    `<end>_token_id` has (llama.cpp's defaults differ by vocabulary type)."""
    if not meta.flag(f"{KEY}add_{end}_token", add):
        return None
    key = KEY + f"{end}_token_id"
    if index is None or meta.has(key):
        index = meta.integer(required(meta, f"{end}_token_id"), lo=0)
    if index >= len(tokens):
        raise ProbeError(
            f"{meta.label}: {key} = {index} is outside the vocabulary of {len(tokens)} tokens; "
            "the file is damaged: download it again."
        )
    return tokens[index], index
