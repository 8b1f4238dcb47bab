"""The SentencePiece tokenizer of a GGUF file (`tokenizer.ggml.model == "llama"`), as llama.cpp
runs it: Llama 2, Mistral, TinyLlama, Gemma, Gemma 2, Gemma 3, Phi-3.

Such a file stores each token with a score and a type, no merges. llama.cpp (`llama-vocab.cpp`,
`llm_tokenizer_spm`, the BPE of SentencePiece itself) tokenizes a piece of text so:

    control, unknown and user-defined tokens are matched whole in the text first; each piece of
    text between them:
    text -> " " + text when `tokenizer.ggml.add_space_prefix` (default true)
         -> every " " -> "▁" (U+2581)
         -> one symbol per character; repeatedly merge the adjacent pair whose concatenation is a
            token of the highest score (ties: the leftmost pair)
         -> a symbol that is no token (a character outside the vocabulary) -> its UTF-8 bytes as
            the byte tokens <0x00>..<0xFF>
    then BOS before it all (`add_bos_token`, default true) and EOS after (`add_eos_token`, false).

The `tokenizers` package runs the same merges as a BPE model whose merge list is every way to cut
each token into two tokens, ranked by the token's score (highest first): its BPE also merges the
best-ranked adjacent pair first, the leftmost of equal rank, and `byte_fallback` spells a
character outside the vocabulary in byte tokens. The one difference: two different tokens of
*equal* score competing for overlapping pairs; llama.cpp takes the leftmost pair, here the token
listed first wins. SentencePiece's BPE gives every normal token its own score, so its files never
meet this. The text prefix and the escape are a normalizer, applied to each piece of text between
added tokens, so that a space is prefixed after every control token, as llama.cpp does.

Decoding: "▁" -> " ", byte tokens -> their bytes, and the one prefixed space stripped.
"""

from __future__ import annotations

import numbers

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from probe.errors import ProbeError
from probe.interop.fields import Fields
from probe.interop.gguf_vocab import (
    CONTROL,
    KEY,
    UNKNOWN,
    USER_DEFINED,
    end_token,
    per_token,
)

SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space


def spm_tokenizer(meta: Fields, tokens: list[str], types: list[int]) -> Tokenizer:
    """The tokenizer of a SentencePiece vocabulary: `tokens` and their `types` as the file lists
    them; the scores, special ids and flags are read from `meta` (llama.cpp's defaults)."""
    scores = per_token(meta, "scores", len(tokens), 0.0, _is_score, "numbers", "scores")
    # llama.cpp names an empty token so it can be looked up (and never matched in text)
    tokens = [token or f"[EMPTY_{i}]" for i, token in enumerate(tokens)]
    vocab = _vocab(meta, tokens)
    unk = meta.integer(KEY + "unknown_token_id", 0, lo=0)
    model = models.BPE(
        vocab=vocab,
        merges=merges_by_score(tokens, scores, vocab),
        unk_token=tokens[unk] if unk < len(tokens) else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(model)
    prefix = meta.flag(KEY + "add_space_prefix", True)
    escape = normalizers.Replace(" ", SPACE)
    tok.normalizer = (
        normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if prefix else escape
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    pairs = list(zip(tokens, types, strict=True))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in pairs if k in (CONTROL, UNKNOWN)]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in pairs if k == USER_DEFINED])
    template = _template(meta, tokens)
    if template is not None:
        tok.post_processor = template
    return tok


def merges_by_score(
    tokens: list[str], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """Every cut of a token into two tokens, the cuts of higher-scored tokens first (for equal
    scores, the token listed first; for one token, the shorter left part first). llama.cpp merges
    by text, so tokens of every type are cut: a control token spelled in pieces is formed too."""
    # stable: equal scores keep the file's order
    ranked = sorted(range(len(tokens)), key=lambda i: -scores[i])
    merges = []
    for i in ranked:
        token = tokens[i]
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    return merges


def _is_score(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _vocab(meta: Fields, tokens: list[str]) -> dict[str, int]:
    """Token -> id; a token listed twice is refused, as llama.cpp refuses it."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in vocab:
            raise ProbeError(
                f"{meta.label}: {KEY}tokens lists {token!r:.40} twice (ids {vocab[token]} and "
                f"{i}); the file is damaged: download it again."
            )
        vocab[token] = i
    return vocab


def _template(meta: Fields, tokens: list[str]) -> processors.TemplateProcessing | None:
    """BOS (id 1 unless the file says) before the text unless `add_bos_token` is false; EOS (id 2)
    after it when `add_eos_token` is true: llama.cpp's defaults for SentencePiece."""
    bos = end_token(meta, "bos", tokens, add=True, index=1)
    eos = end_token(meta, "eos", tokens, add=False, index=2)
    ends = [end for end in (bos, eos) if end is not None]
    if not ends:
        return None
    first = [bos[0]] if bos else []
    last = [eos[0]] if eos else []
    return processors.TemplateProcessing(
        single=[*first, "$A", *last],
        pair=[*first, "$A", *last, *first, "$B:1", *last],
        special_tokens=list(dict(ends).items()),
    )
