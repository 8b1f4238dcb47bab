"""Real text in: the shipped corpus, documents from a file, tokenization into fixed-size chunks.

A document is tokenized once, without special tokens; its ids are then cut into consecutive pieces
of at most `max_tokens - n_special` ids (or only the first piece is kept, when truncating), and
the tokenizer's post-processor wraps each piece in its special tokens ([CLS] ... [SEP] for BERT,
BOS for Llama-style tokenizers, nothing for GPT-2). So every chunk looks like a whole input to the
model, and the pieces' ids concatenated give back the document's ids.

    docs = read_documents(None)                      # the shipped corpus, one document per line
    chunks = tokenize_documents(docs, tok, max_tokens=128, max_chunks=256)
    for ids, mask in batches(chunks, 32): ...        # [batch, pos] each
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from tokenizers import Encoding, Tokenizer

from probe.data.tasks import Batch
from probe.errors import ProbeError
from probe.files import check_input_file
from probe.words import counted

CORPUS = ("data", "corpus", "stdlib_docs.txt")  # inside the `probe` package; see its SOURCE.md


@dataclass(frozen=True)
class TextOptions:
    """What the caller calls its text settings, for messages that say what to change: `probe`'s
    options by default (`inspect` and `eval` take the row width as --lengths); a study file
    names its own fields."""

    text: str = "--text"  # the text file
    width: str = "--max-tokens"  # tokens per row
    batch_size: str = "--batch-size"  # rows per batch
    batches: str = "--batches"  # batches per set


def default_corpus() -> Path:
    """The shipped English corpus: docstrings of the Python 3.11 standard library (PSF licence)."""
    path = Path(str(resources.files("probe").joinpath(*CORPUS)))
    if not path.is_file():
        raise ProbeError(
            f"The shipped corpus is missing ({path}); reinstall probe, or pass a text file."
        )
    return path


READ_LIMIT = 4 * 2**20  # bytes of a text file read: about a million tokens, more than any
# command tokenizes (a 60 MB file is not read, split and tokenized whole to use a few rows of it)


def read_documents(path: Path | str | None = None, *, whole: bool = False,
                   max_bytes: int = READ_LIMIT) -> list[str]:  # fmt: skip
    """Documents of a UTF-8 text file: one per non-empty line (stripped), or the whole file as one.

    `path=None` reads the shipped corpus. Only the first `max_bytes` bytes of a larger file are
    read, cut at the end of a line (`read_note` says so in words).
    """
    path = default_corpus() if path is None else Path(path)
    if not path.is_dir():  # a folder is "No text file" below
        check_input_file(path, "a UTF-8 text file")
    if not path.is_file():
        raise ProbeError(f"No text file at {path}: give the path of a UTF-8 text file.")
    try:
        text = _read_prefix(path, max_bytes)
    except OSError as exc:
        raise ProbeError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise ProbeError(
            f"{path} is not UTF-8 text (byte {exc.start} cannot be decoded); "
            "give a plain text file, or convert it with `iconv -t utf-8`."
        ) from None
    if "\x00" in text:
        raise ProbeError(f"{path} holds NUL bytes, so it is binary, not text; give a text file.")
    if not text.strip():
        raise ProbeError(f"{path} is empty; give a file with some text in it.")
    if whole:
        return [text]
    return [line.strip() for line in text.splitlines() if line.strip()]


def _read_prefix(path: Path, max_bytes: int) -> str:
    """The file's text, or its first `max_bytes` bytes cut after the last newline in them (or,
    with none, at the last whole UTF-8 character)."""
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    data = data[:max_bytes]
    end = data.rfind(b"\n")
    if end > 0:
        return data[: end + 1].decode("utf-8")
    for trim in range(4):  # a character cut in two at the limit: drop its first bytes
        try:
            return data[: len(data) - trim].decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(data) - 4:
                raise
    return data.decode("utf-8")


def read_note(path: Path | str | None, max_bytes: int = READ_LIMIT) -> str | None:
    """What `read_documents` leaves out of a large file, in words (None: it reads it all)."""
    if path is None:
        return None
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None
    if size <= max_bytes:
        return None
    return (f"{path} is {size / 2**20:,.1f} MiB: only its first {max_bytes / 2**20:,.0f} MiB "
            "(to the end of a line) are read, far more text than this command uses")  # fmt: skip


@dataclass(frozen=True)
class TokenChunks:
    """Tokenized documents as fixed-width rows, padded on the right."""

    ids: torch.Tensor  # [chunk, pos] long; `pad_id` where mask is False
    mask: torch.Tensor  # [chunk, pos] bool; True on real tokens (special ones included)
    special: torch.Tensor  # [chunk, pos] bool; True on tokens the post-processor added
    lengths: torch.Tensor  # [chunk] long; real tokens per row, mask.sum(1)
    doc: torch.Tensor  # [chunk] long; index of the document each row comes from
    pad_id: int  # the id written into padding positions

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.ids.shape[1]


def tokenize_documents(
    docs: Sequence[str],
    tokenizer: Tokenizer,
    max_tokens: int,
    *,
    chunk: bool = True,
    add_special: bool = True,
    max_chunks: int | None = None,
) -> TokenChunks:
    """Tokenize `docs` into rows of at most `max_tokens` tokens each.

    chunk=True cuts each document into consecutive rows; chunk=False keeps only its first row
    (truncation). add_special wraps every row in the tokenizer's special tokens. max_chunks keeps
    the first that many rows (documents in order). Documents with no tokens give no rows.
    """
    if isinstance(docs, str):
        raise ProbeError("docs should be a list of documents, not one string; wrap it: [text].")
    if not isinstance(max_tokens, int) or max_tokens < 2:
        raise ProbeError(f"max_tokens must be an integer of at least 2, not {max_tokens!r}.")
    if max_chunks is not None and (not isinstance(max_chunks, int) or max_chunks < 1):
        raise ProbeError(f"max_chunks must be a positive integer or None, not {max_chunks!r}.")
    n_special = tokenizer.num_special_tokens_to_add(is_pair=False) if add_special else 0
    budget = max_tokens - n_special  # content ids per row
    if budget < 1:
        raise ProbeError(
            f"max_tokens={max_tokens} leaves no room for text: this tokenizer adds {n_special} "
            f"special tokens to each row; use max_tokens of at least {n_special + 1}."
        )
    pad_id = _pad_id(tokenizer)
    tokenizer = _without_truncation(tokenizer)
    rows: list[Encoding] = []
    doc_of_row: list[int] = []
    for index, encoding in enumerate(_encodings(docs, tokenizer, budget, chunk, max_chunks, rows)):
        if max_chunks is not None and len(rows) >= max_chunks:
            break
        if not encoding.ids:
            continue
        encoding.truncate(budget)  # the rest moves to encoding.overflowing, `budget` ids each
        wrapped = tokenizer.post_process(encoding, add_special_tokens=add_special)
        pieces = [wrapped, *wrapped.overflowing] if chunk else [wrapped]
        if max_chunks is not None:
            pieces = pieces[: max_chunks - len(rows)]
        rows.extend(pieces)
        doc_of_row.extend([index] * len(pieces))
    if not rows:
        raise ProbeError(
            "The documents hold no tokens; give non-empty text (an empty file, or only "
            "whitespace, tokenizes to nothing)."
        )
    return _stack(rows, doc_of_row, max_tokens, pad_id)


def _encodings(docs: Sequence[str], tokenizer: Tokenizer, budget: int, chunk: bool,
               max_chunks: int | None, rows: list) -> Iterator[Encoding]:  # fmt: skip
    """Each document's encoding, without special tokens. With `max_chunks`, documents are
    encoded one at a time, while `rows` (filled by the caller) still needs some, and only as
    much of each as those rows take: a large text is never tokenized whole for a few rows."""
    if max_chunks is None:
        yield from tokenizer.encode_batch(list(docs), add_special_tokens=False)
        return
    for doc in docs:
        wanted = (max_chunks - len(rows)) * budget if chunk else budget
        yield _encode_prefix(tokenizer, doc, wanted)


PREFIX_MARGIN = 64  # ids encoded past those needed: the last word before a cut may tokenize
# differently from the whole text's, so the ids kept end well before it


def _encode_prefix(tokenizer: Tokenizer, text: str, wanted: int) -> Encoding:
    """An encoding whose first `wanted` ids are those of the whole `text`: the encoding of a
    prefix cut at a space or line end, grown until it gives PREFIX_MARGIN ids more (or the
    whole text's)."""
    size = 8 * (wanted + PREFIX_MARGIN)
    while size < len(text):
        cut = max(text.rfind(" ", 0, size), text.rfind("\n", 0, size))
        encoding = tokenizer.encode(text[: cut if cut > 0 else size], add_special_tokens=False)
        if len(encoding.ids) >= wanted + PREFIX_MARGIN:
            return encoding
        size *= 4
    return tokenizer.encode(text, add_special_tokens=False)


def batches(chunks: TokenChunks, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (ids, mask) batches of `batch_size` rows, the last one possibly smaller."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ProbeError(f"batch_size must be a positive integer, not {batch_size!r}.")
    for start in range(0, len(chunks), batch_size):
        stop = start + batch_size
        yield chunks.ids[start:stop], chunks.mask[start:stop]  # [batch, pos] each


def _without_truncation(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer, or a copy without its own truncation and padding (a tokenizer.json may set
    both, e.g. MiniLM's truncates at 128); chunking here decides lengths."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain


def _pad_id(tokenizer: Tokenizer) -> int:
    """The tokenizer's padding id (its own setting, else a [PAD]-like token), else 0: padding is
    masked out, so the choice only has to be a valid id."""
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"])
    for token in ("[PAD]", "<pad>"):
        index = tokenizer.token_to_id(token)
        if index is not None:
            return index
    return 0


def _stack(rows: list[Encoding], doc: list[int], width: int, pad_id: int) -> TokenChunks:
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [chunk, pos]
    special = torch.zeros(len(rows), width, dtype=torch.bool)  # [chunk, pos]
    lengths = torch.tensor([len(row.ids) for row in rows], dtype=torch.long)  # [chunk]
    for i, row in enumerate(rows):
        ids[i, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
        special[i, : len(row.ids)] = torch.tensor(row.special_tokens_mask, dtype=torch.bool)
    mask = torch.arange(width) < lengths[:, None]  # [chunk, pos]
    return TokenChunks(
        ids=ids,
        mask=mask,
        special=special,
        lengths=lengths,
        doc=torch.tensor(doc, dtype=torch.long),
        pad_id=pad_id,
    )


# ------------------------------------------------------------------ batches for an objective
MASK_FRACTION = 0.15  # of the content tokens, for the masked-LM objective (Devlin et al. 2019)


def stream_rows(
    docs: Sequence[str],
    tokenizer: Tokenizer,
    max_tokens: int,
    max_rows: int | None = None,
    options: TextOptions = TextOptions(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents joined by newlines into one stream, cut into full rows of `max_tokens`
    tokens (each wrapped in the tokenizer's special tokens): ids and special-token flags,
    [row, max_tokens] each, no padding. A stream shorter than one row is a clear error."""
    chunks = tokenize_documents(
        ["\n".join(docs)], tokenizer, max_tokens, chunk=True, max_chunks=max_rows
    )
    full = chunks.lengths == max_tokens  # [chunk]
    if not bool(full.any()):
        raise ProbeError(
            f"The text has only {int(chunks.lengths.max())} tokens, fewer than one row of "
            f"{max_tokens} tokens ({options.width} {max_tokens}); give more text "
            f"({options.text}) or a smaller {options.width}."
        )
    return chunks.ids[full], chunks.special[full]


def text_batches(
    docs: Sequence[str],
    tokenizer: Tokenizer,
    objective: str,
    max_tokens: int,
    batch_size: int,
    n_batches: int,
    seed: int = 0,
    options: TextOptions = TextOptions(),
) -> list[Batch]:
    """Batches of real text for an imported model's objective:

    causal-lm: predict each next token; masked-lm: predict MASK_FRACTION of the content tokens
    replaced by [MASK] (chosen with `seed`); embedding: the inputs only (pair them with the
    original model's embeddings with `evaluate.with_reference`)."""
    ids, special = stream_rows(docs, tokenizer, max_tokens, batch_size * n_batches, options)
    return _objective_batches(ids, special, tokenizer, objective, batch_size, seed)


def _objective_batches(
    ids: torch.Tensor, special: torch.Tensor, tokenizer: Tokenizer, objective: str,
    batch_size: int, seed: int,
) -> list[Batch]:  # fmt: skip
    """Rows of `stream_rows` ([row, max_tokens] ids and special flags) as objective batches."""
    max_tokens = ids.shape[1]
    out = []
    generator = torch.Generator().manual_seed(seed)
    for start in range(0, ids.shape[0], batch_size):
        rows, spec = ids[start : start + batch_size], special[start : start + batch_size]
        targets = torch.zeros_like(rows)  # [batch, seq]
        loss_mask = torch.zeros_like(rows, dtype=torch.bool)  # [batch, seq]
        inputs = rows
        if objective == "causal-lm":
            targets[:, :-1] = rows[:, 1:]
            loss_mask[:, :-1] = True
        elif objective == "masked-lm":
            mask_id = tokenizer.token_to_id("[MASK]")
            if mask_id is None:
                raise ProbeError("The tokenizer has no [MASK] token: masked-LM loss is undefined.")
            chosen = (torch.rand(rows.shape, generator=generator) < MASK_FRACTION) & ~spec
            inputs = rows.masked_fill(chosen, mask_id)
            targets, loss_mask = rows.clone(), chosen
        elif objective != "embedding":
            raise ProbeError(f"Unknown objective '{objective}'.")
        out.append(Batch(inputs, targets, loss_mask, None, max_tokens, objective=objective))
    return out


def text_splits(
    docs: Sequence[str],
    tokenizer: Tokenizer,
    objective: str,
    max_tokens: int,
    batch_size: int,
    n_batches: int,
    n_importance: int = 1,
    seed: int = 0,
    options: TextOptions = TextOptions(),
) -> tuple[list[list[Batch]], list[Batch]]:
    """`n_importance` disjoint sets of text batches to estimate importance on, then a scoring
    set: consecutive rows of the text stream, so no row is in two sets. `options` names the
    caller's settings in the message for too little text."""
    per_set = batch_size * n_batches
    need = per_set * (n_importance + 1)
    ids, special = stream_rows(docs, tokenizer, max_tokens, need, options)
    if ids.shape[0] < need:
        sets = counted(n_importance + 1, "disjoint set")
        raise ProbeError(
            f"The text gives {counted(ids.shape[0], 'row')} of {max_tokens} tokens but {need:,} "
            f"are needed ({sets} of {n_batches} x {batch_size}); give more text "
            f"({options.text}), or lower {options.batch_size}, {options.batches} or "
            f"{options.width}."
        )
    batches = _objective_batches(ids, special, tokenizer, objective, batch_size, seed)
    sets = [batches[i * n_batches : (i + 1) * n_batches] for i in range(n_importance + 1)]
    return sets[:-1], sets[-1]
