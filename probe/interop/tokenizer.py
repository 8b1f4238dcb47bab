"""Tokenizers for imported models: a Hugging Face `tokenizer.json`, or one rebuilt from GGUF.

Everything here is the `tokenizers` package; transformers is never needed at run time.

A GGUF file has no `tokenizer.json`. It stores the vocabulary, the merges, each token's type and
the special token ids as metadata under llama.cpp's key names (`tokenizer.ggml.*`), plus the name
of the pre-tokenizer the vocabulary was trained with (`tokenizer.ggml.pre`). For a byte-level BPE
vocabulary (`tokenizer.ggml.model == "gpt2"`) we rebuild the tokenizer as llama.cpp runs it:

    text -> split by the pre-tokenizer's regexes, in order (llama.cpp `llama-vocab.cpp`)
         -> map every byte to its printable stand-in (GPT-2's byte alphabet: " " -> "Ġ")
         -> BPE with the file's merges
    control tokens (type 3, "<|im_start|>") and user-defined ones (type 4) match whole in the text.

A SentencePiece vocabulary (`"llama"`: Llama 2, Mistral, Gemma, Phi-3) is rebuilt by
`tokenizer_spm`; WordPiece, Unigram and RWKV vocabularies are refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from probe.errors import ProbeError, optional
from probe.files import atomic_write_text
from probe.interop.fields import Fields
from probe.interop.gguf import metadata_of
from probe.interop.gguf_vocab import (
    CONTROL,
    KEY,
    NORMAL,
    USER_DEFINED,
    end_token,
    required,
    strings,
    token_types,
)
from probe.interop.tokenizer_spm import spm_tokenizer

# `tokenizer.ggml.model` values we rebuild: byte-level BPE, SentencePiece (`tokenizer_spm`)
SUPPORTED_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece"}

# The pre-tokenizer regexes of llama.cpp (`llama_vocab::impl::load`, `regex_exprs`), by the name a
# GGUF gives in `tokenizer.ggml.pre`. Each regex splits the pieces the previous one left.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]  # applied in order, each to the pieces the previous one left
    ignore_merges: bool = False  # a piece already in the vocabulary is one token (llama3 family)


_FAMILIES = {
    PreTokenizer((_GPT2,)): ("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais"),
    PreTokenizer((r"\p{N}", _GPT2)): (
        "starcoder",
        "refact",
        "command-r",
        "smollm",
        "codeshell",
        "exaone",
        "minerva",
    ),
    PreTokenizer((_LLAMA3,), ignore_merges=True): (
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "smaug-bpe",
        "dbrx",
    ),
    PreTokenizer((_QWEN2,)): ("qwen2", "deepseek-r1-qwen"),
}
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: pre for pre, names in _FAMILIES.items() for name in names
}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a `tokenizer.json`, or from a directory holding one.

    The file's own truncation and padding (MiniLM's cut and pad everything to 128 tokens) are
    switched off: lengths are the caller's to choose, see `probe.data.text.tokenize_documents`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ProbeError(
            f"No tokenizer file at {path}: give a tokenizer.json, or the model directory "
            "holding one (as downloaded from the Hugging Face hub)."
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for any parse error
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProbeError(
            f"{path} is not a readable tokenizer.json ({first}); download it again, or save one "
            "with `tokenizer.save_pretrained(dir)` in transformers."
        ) from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def save_tokenizer(tok: Tokenizer, path: str | Path) -> Path:
    """Write `tok` as a tokenizer.json (`path` may be a directory); written atomically."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"

    atomic_write_text(path, tok.to_str(pretty=True))
    return path


def gguf_metadata(path: str | Path, prefix: str = "") -> dict[str, Any]:
    """The key-value metadata of a GGUF file, strings decoded and arrays as lists.

    `prefix` keeps only the keys starting with it, e.g. `"tokenizer."`.
    """
    path = Path(path)
    if not path.is_file():
        raise ProbeError(f"No GGUF file at {path}: check the path.")
    GGUFReader = optional("gguf", "Reading a GGUF file").GGUFReader
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # bad magic, truncated file, unknown version
        raise ProbeError(f"{path} is not a readable GGUF file ({exc}).") from None

    return {k: v for k, v in metadata_of(reader, path).items() if k.startswith(prefix)}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: every byte as a printable character (" " -> "Ġ", "\\n" -> "Ċ")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tokenizer_from_gguf(metadata: Mapping[str, Any] | Fields, path: str | Path | None = None
                        ) -> Tokenizer:  # fmt: skip
    """Rebuild the tokenizer a GGUF file describes from its metadata (`tokenizer.ggml.*` keys).

    `metadata` is a plain dict, as `gguf_metadata(path)` returns it, or `Fields` over one; every
    value is read through `Fields`, so a message names the file (`path`) and the key.
    """
    meta = (
        metadata
        if isinstance(metadata, Fields)
        else Fields(
            metadata, f"GGUF file '{path}': metadata" if path is not None else "GGUF metadata"
        )
    )
    model = meta.name(required(meta, "model"))
    if model not in SUPPORTED_MODELS:
        supported = ", ".join(f"{name} ({kind})" for name, kind in SUPPORTED_MODELS.items())
        raise ProbeError(
            f"{meta.label}: {KEY}model {model!r:.60} is not supported; supported: {supported}. "
            "Use the model's tokenizer.json."
        )
    tokens = strings(meta, required(meta, "tokens"))
    types = token_types(meta, len(tokens))
    if model == "llama":
        return spm_tokenizer(meta, tokens, types)
    pre_name = meta.name(required(meta, "pre"))
    if pre_name not in PRE_TOKENIZERS:
        raise ProbeError(
            f"{meta.label}: {KEY}pre {pre_name!r:.60} is not supported; supported: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}. Use the model's tokenizer.json instead."
        )
    pre = PRE_TOKENIZERS[pre_name]
    vocab = _vocab(tokens, types)
    merges = _merges(meta, strings(meta, required(meta, "merges")), vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    pairs = list(zip(tokens, types, strict=True))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in pairs if k == CONTROL]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in pairs if k == USER_DEFINED])
    tok.post_processor = _post_processor(meta, tokens)
    return tok


def _vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    """Token -> id. Normal tokens are spelled in the byte alphabet; a file that stores one in plain
    text gets it respelled. Control and user-defined tokens keep their own spelling: they are
    matched whole in the text, never built from bytes. A repeated token keeps its first id."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == NORMAL and not set(token) <= alphabet:
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, i)
    return vocab


def _merges(meta: Fields, merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges as pairs; each must join two tokens of the vocabulary into a third (the
    tokenizers package panics on one that does not)."""
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ProbeError(
                f"{meta.label}: {KEY}merges: GGUF merge {merge!r:.60} is not two tokens "
                "separated by one space; the file is damaged: download it again."
            )
        missing = [t for t in (*parts, "".join(parts)) if t not in vocab]
        if missing:
            raise ProbeError(
                f"{meta.label}: {KEY}merges: GGUF merge {merge!r:.60} needs the token "
                f"{missing[0]!r:.40}, which is not in the vocabulary ({KEY}tokens); the file is "
                "damaged: download it again."
            )
        pairs.append((parts[0], parts[1]))
    return pairs


def _post_processor(meta: Fields, tokens: list[str]) -> processors.PostProcessor:
    """Byte-level offsets, plus BOS/EOS where the file's `add_bos_token`/`add_eos_token` say so."""
    offsets = processors.ByteLevel(trim_offsets=False)
    ends = {end: end_token(meta, end, tokens) for end in ("bos", "eos")}
    ends = {end: token for end, token in ends.items() if token is not None}
    if not ends:
        return offsets
    bos = [ends["bos"][0]] if "bos" in ends else []
    eos = [ends["eos"][0]] if "eos" in ends else []
    template = processors.TemplateProcessing(
        single=[*bos, "$A", *eos],
        pair=[*bos, "$A", *eos, *bos, "$B:1", *eos],
        special_tokens=list(ends.values()),
    )
    return processors.Sequence([offsets, template])
