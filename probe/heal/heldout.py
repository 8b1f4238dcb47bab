"""The held-out text a healing study measures perplexity on: passages of every project of the
shipped manuals corpus, in an order drawn from a seed, without what they share with the training
pages.

De-duplication is by 13-grams of whitespace-split words, not of tokens: the text measured is
then the same for every model's tokenizer, and 13 words (about 17 SmolLM2 tokens) is the span
of GPT-3's contamination check (Brown et al. 2020). A held-out sentence that shares any 13
consecutive words with a training page is dropped, with every sentence those words reach into;
the page keeps its other sentences, in passages of consecutive kept sentences (at most PASSAGE
words), so every 13 words inside a passage were consecutive on the page and none occur in a
training page. Dropping whole pages instead would leave no held-out page of Scrapy or mypy.

The sample takes the projects in turn (corpus order), a passage of each, each project's pages in
an order drawn from `seed` and a page's passages in page order; a project whose passages run out
drops out of the turns. The caller measures the first tokens of the passages' stream.

    sample = heldout_sample(seed=0)
    sample.docs                          # the passages in order: `probe.heal.loop.heal`'s text
    sample.usage(count_tokens, 32768)    # per project: pages, what was dropped, what was used

The 13-grams are hashed to 64-bit integers (a stable hash of each word, combined by a polynomial
with an odd multiplier), the training part's kept as a sorted array, built once per process
(`training_ngrams`). Equal 13-grams hash equal, so nothing shared is kept; two different ones
collide with probability about 2**-64 per pair, which at worst drops a sentence too many.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from probe.errors import ProbeError

NGRAM = 13  # words a held-out passage may not share with a training page
# words of a passage, the unit the projects take turns by: about 700 SmolLM2 tokens, so a row of
# 512 tokens mostly stays within one project's page while 32,768 tokens take every project's
# turn about four times (turns by whole pages let one 16,000-token page fill half the text)
PASSAGE = 512
ENDS = (".", "!", "?", ":")  # a word ending in one ends a sentence
CLOSERS = "\"')]*`"  # after the end: `"done."` and `(see below.)` end one too
MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it is a bijection mod 2**64


def _word_values(words: Sequence[str], memo: dict[str, int]) -> np.ndarray:
    """A stable 64-bit hash of each word (blake2b), memoised in `memo`: [words] uint64."""
    for word in set(words).difference(memo):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        memo[word] = int.from_bytes(digest, "little")
    return np.fromiter(map(memo.__getitem__, words), dtype=np.uint64, count=len(words))


def ngram_hashes(words: Sequence[str], n: int, memo: dict[str, int]) -> np.ndarray:
    """The hash of each run of `n` consecutive words: [len(words) - n + 1] uint64 (none when
    fewer words), sum of word values times MULTIPLIER**(n - 1 - j), wrapping mod 2**64."""
    m = len(words) - n + 1
    if m < 1:
        return np.empty(0, dtype=np.uint64)
    values = _word_values(words, memo)  # [words]
    h = values[:m].copy()  # [m]
    for j in range(1, n):  # Horner's rule over the window
        h = h * MULTIPLIER + values[j : j + m]
    return h


def ngram_set(pages: Sequence[str], n: int = NGRAM) -> np.ndarray:
    """The sorted distinct n-gram hashes of `pages` (no n-gram spans two pages)."""
    memo: dict[str, int] = {}
    parts = [ngram_hashes(page.split(), n, memo) for page in pages]
    found = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)
    found.setflags(write=False)
    return found


@lru_cache(maxsize=2)
def training_ngrams(n: int = NGRAM) -> np.ndarray:
    """The n-gram hashes of the shipped training pages, built once per process (~1.3M of 13
    words: 11 MB)."""
    from probe.data.docs import docs_corpus

    return ngram_set(docs_corpus("train"), n)


def contains(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each of `values` is in `table` (sorted): [values] bool, by binary search."""
    at = np.minimum(np.searchsorted(table, values), max(len(table) - 1, 0))
    return table[at] == values if len(table) else np.zeros(len(values), dtype=bool)


@dataclass(frozen=True)
class Page:
    """One held-out page after de-duplication: its kept sentences in passages (none: the page
    is dropped), and counts of what it held and what was dropped."""

    project: str
    passages: tuple[str, ...]
    sentences: int
    sentences_dropped: int
    words: int
    words_dropped: int


def sentence_spans(words: Sequence[str]) -> list[tuple[int, int]]:
    """[start, end) word spans of the sentences: a sentence ends at a word ending in ENDS."""
    spans, start = [], 0
    for i, word in enumerate(words):
        if word.rstrip(CLOSERS).endswith(ENDS):
            spans.append((start, i + 1))
            start = i + 1
    if start < len(words):
        spans.append((start, len(words)))
    return spans


def shared_words(words: Sequence[str], train: np.ndarray, n: int,
                 memo: dict[str, int]) -> np.ndarray:  # fmt: skip
    """Which words lie inside an n-gram that `train` (sorted hashes) holds: [words] bool."""
    starts = np.flatnonzero(contains(train, ngram_hashes(words, n, memo)))
    edges = np.zeros(len(words) + 1, dtype=np.int64)  # +1 where a shared n-gram starts, -1 after
    np.add.at(edges, starts, 1)
    np.add.at(edges, starts + n, -1)
    return np.cumsum(edges)[: len(words)] > 0


def clean_page(text: str, project: str, train: np.ndarray, n: int, passage: int,
               memo: dict[str, int]) -> Page:  # fmt: skip
    """`text` without the sentences that share an n-gram with `train`, its other sentences in
    passages of at most `passage` words (a longer sentence alone), none spanning a dropped
    sentence (so every n words of a passage were consecutive on the page)."""
    words = text.split()
    hit = shared_words(words, train, n, memo)  # [words]
    spans = sentence_spans(words)
    passages: list[list[str]] = [[]]
    dropped = dropped_words = 0
    for start, end in spans:
        if hit[start:end].any():
            dropped, dropped_words = dropped + 1, dropped_words + end - start
            passages.append([])
            continue
        if passages[-1] and len(passages[-1]) + end - start > passage:
            passages.append([])
        passages[-1] += words[start:end]
    kept = tuple(" ".join(run) for run in passages if run)
    return Page(project, kept, len(spans), dropped, len(words), dropped_words)


@dataclass(frozen=True)
class HeldOut:
    """The de-duplicated held-out pages (`pages`, in corpus order) and the sample's order of
    their passages (`order`: (page, passage) indices)."""

    pages: tuple[Page, ...]
    order: tuple[tuple[int, int], ...]
    seed: int
    n: int

    @property
    def docs(self) -> list[str]:
        """The passages in the sample's order (the text is their stream)."""
        return [self.pages[page].passages[k] for page, k in self.order]

    def notes(self) -> dict:
        """What the text rests on, for a step's record: the seed, the n-gram, what was dropped."""
        return {"heldout_seed": self.seed, "ngram": self.n, "pages": len(self.pages),
                "pages_cut": sum(p.sentences_dropped > 0 for p in self.pages),
                "pages_emptied": sum(not p.passages for p in self.pages),
                "sentences_dropped": sum(p.sentences_dropped for p in self.pages),
                "words_dropped": sum(p.words_dropped for p in self.pages)}  # fmt: skip

    def usage(self, count: Callable[[str], int], tokens: int) -> pd.DataFrame:
        """Per project: its held-out pages, those left after de-duplication, its sentences and
        words (and how many were dropped), and how many pages and tokens of the first `tokens`
        of the stream are its. `count(text)`: the tokens of a text; passages are joined by
        newlines (a token each, as `probe.data.text.stream_rows` joins documents)."""
        used = dict.fromkeys(range(len(self.pages)), 0)  # tokens of each page measured
        start = 0
        for page, k in self.order:
            if start >= tokens:
                break
            size = count(self.pages[page].passages[k]) + 1
            used[page] += min(start + size, tokens) - start
            start += size
        rows = []
        for project in dict.fromkeys(p.project for p in self.pages):
            mine = [i for i, p in enumerate(self.pages) if p.project == project]
            pages = [self.pages[i] for i in mine]
            rows.append({"seed": self.seed, "project": project, "pages": len(pages),
                         "pages_kept": sum(bool(p.passages) for p in pages),
                         "pages_cut": sum(p.sentences_dropped > 0 for p in pages),
                         "sentences": sum(p.sentences for p in pages),
                         "sentences_dropped": sum(p.sentences_dropped for p in pages),
                         "words": sum(p.words for p in pages),
                         "words_dropped": sum(p.words_dropped for p in pages),
                         "pages_used": sum(used[i] > 0 for i in mine),
                         "tokens_used": sum(used[i] for i in mine), "ngram": self.n})  # fmt: skip
        return pd.DataFrame(rows)


def select(pages: Sequence[str], projects: Sequence[str], train: np.ndarray, seed: int,
           n: int = NGRAM, passage: int = PASSAGE) -> HeldOut:  # fmt: skip
    """De-duplicate `pages` (of `projects`, one each) against `train`'s n-gram hashes and order
    their passages: the projects in turn, a passage each, each project's pages in an order
    drawn from `seed` and a page's passages in page order."""
    if len(pages) != len(projects):
        raise ProbeError(f"{len(pages):,} held-out pages but {len(projects):,} project labels; "
                         "reinstall probe.")  # fmt: skip
    memo: dict[str, int] = {}
    cleaned = tuple(clean_page(text, project, train, n, passage, memo)
                    for text, project in zip(pages, projects, strict=True))  # fmt: skip
    rng = np.random.default_rng(seed)
    queues = []
    for project in dict.fromkeys(projects):
        mine = [i for i, p in enumerate(cleaned) if p.project == project]
        shuffled = [mine[k] for k in rng.permutation(len(mine))]
        queues.append([(i, k) for i in shuffled for k in range(len(cleaned[i].passages))])
    turns = max(map(len, queues), default=0)
    order = tuple(q[t] for t in range(turns) for q in queues if t < len(q))
    return HeldOut(cleaned, order, seed, n)


def heldout_sample(seed: int, n: int = NGRAM, passage: int = PASSAGE) -> HeldOut:
    """The shipped held-out pages, de-duplicated against the training pages and ordered by
    `seed` (see the module's docstring)."""
    from probe.data.docs import docs_corpus, docs_projects

    pages, projects = docs_corpus("heldout"), docs_projects("heldout")
    return select(pages, projects, training_ngrams(n), seed, n, passage)
