"""The healing study's held-out text (`probe.heal.heldout`): the project labels of the manuals
corpus, de-duplication against the training pages checked by brute force on a synthetic corpus
(tuples of words, the sentences to drop found independently) and on the shipped one (a second
implementation over every 13 words of every training page), the projects taking turns, and seeds
that draw different text."""

from __future__ import annotations

import random

import numpy as np
import pytest

from probe.data.docs import PROJECTS, docs_corpus, docs_projects
from probe.errors import ProbeError
from probe.heal.heldout import contains, heldout_sample, ngram_set, select

N = 13


def windows(words: list[str], n: int = N) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def sentences_of(words: list[str]) -> list[list[str]]:
    """Sentences by the rule the module states: each ends at a word ending in a full stop (the
    synthetic text has no other end)."""
    out, run = [], []
    for word in words:
        run.append(word)
        if word.endswith("."):
            out.append(run)
            run = []
    return out + ([run] if run else [])


def expected_runs(words: list[str], train: set[tuple[str, ...]]) -> tuple[list[str], int]:
    """Brute force: the runs of consecutive kept sentences of a page, and how many sentences
    were dropped (a sentence is dropped when a window of 13 words found in `train` touches it)."""
    covered = [False] * len(words)
    for i, gram in enumerate(windows(words)):
        if gram in train:
            covered[i : i + N] = [True] * N
    runs, run, dropped, at = [], [], 0, 0
    for sentence in sentences_of(words):
        if any(covered[at : at + len(sentence)]):
            dropped += 1
            runs, run = runs + ([" ".join(run)] if run else []), []
        else:
            run += sentence
        at += len(sentence)
    return runs + ([" ".join(run)] if run else []), dropped


def random_sentence(rng: random.Random) -> list[str]:
    words = [f"w{rng.randrange(5000)}" for _ in range(rng.randrange(6, 18))]
    return [*words[:-1], words[-1] + "."]


def random_page(rng: random.Random, sentences: int) -> list[str]:
    return [w for _ in range(sentences) for w in random_sentence(rng)]


@pytest.fixture(scope="module")
def synthetic():
    """Training pages and held-out pages of three projects: copied runs of 13 words (one across
    a sentence end), a copied run of 12 (kept), a page copied whole (dropped), clean pages."""
    rng = random.Random(7)
    train = [random_page(rng, 30) for _ in range(6)]
    held = {name: [random_page(rng, 12) for _ in range(count)]
            for name, count in (("A", 4), ("B", 2), ("C", 1))}  # fmt: skip
    a0, a1, b0 = held["A"][0], held["A"][1], held["B"][0]
    held["A"][0] = a0[:40] + train[0][50:63] + a0[40:]  # 13 copied words: dropped
    held["A"][1] = a1[:30] + train[1][10:22] + a1[30:]  # 12 copied words: kept
    held["B"][0] = b0[:20] + train[2][100:140] + b0[20:]  # 40 words, across sentence ends
    held["A"][3] = train[3][:120]  # the whole page is training text: nothing left
    pages = [" ".join(p) for name in held for p in held[name]]
    projects = [name for name in held for _ in held[name]]
    return train, pages, projects


def test_the_synthetic_selection_drops_what_brute_force_finds(synthetic):
    train, pages, projects = synthetic
    grams = {g for page in train for g in windows(page)}
    sample = select(pages, projects, ngram_set([" ".join(p) for p in train]), seed=0, n=N,
                    passage=10**6)  # fmt: skip
    dropped_total = 0
    for page, got in zip(pages, sample.pages, strict=True):
        runs, dropped = expected_runs(page.split(), grams)
        assert list(got.passages) == runs and got.sentences_dropped == dropped
        dropped_total += dropped
    assert dropped_total >= 6  # the copies were found (13 words, 40 words, a whole page)
    assert sample.pages[1].sentences_dropped == 0  # 12 copied words are not 13
    usage = sample.usage(lambda text: len(text.split()), 10**9).set_index("project")
    assert usage.loc["A", "pages"] - usage.loc["A", "pages_kept"] == 1  # the copied page
    assert usage.pages_cut.sum() == 3 and usage.sentences_dropped.sum() == dropped_total
    for doc in sample.docs:  # no 13 words of the measured text occur in a training page
        assert not set(windows(doc.split())) & grams


def test_projects_take_turns_by_passage_and_passages_stay_short(synthetic):
    train, pages, projects = synthetic
    sample = select(pages, projects, ngram_set([" ".join(p) for p in train]), seed=3, n=N,
                    passage=40)  # fmt: skip
    turns = [sample.pages[page].project for page, _ in sample.order]
    assert turns[:3] == ["A", "B", "C"]  # a passage of each in turn
    for page in sample.pages:
        for text in page.passages:
            words = text.split()
            assert len(words) <= 40 or len(sentences_of(words)) == 1
    # every kept passage is in the order once, and a page's passages keep their order
    assert sorted(sample.order) == [(i, k) for i, p in enumerate(sample.pages)
                                    for k in range(len(p.passages))]  # fmt: skip
    for i in range(len(sample.pages)):
        mine = [k for page, k in sample.order if page == i]
        assert mine == sorted(mine)


def test_the_seed_orders_each_projects_pages(synthetic):
    train, pages, projects = synthetic
    table = ngram_set([" ".join(p) for p in train])
    firsts = set()
    for seed in range(8):
        sample = select(pages, projects, table, seed=seed, n=N)
        firsts.add(sample.order[0][0])  # project A's first page
        assert sample.pages[sample.order[0][0]].project == "A"
    assert len(firsts) == 3  # A's three kept pages each came first for some seed


def test_contains_is_membership():
    table = np.array([3, 9, 12], dtype=np.uint64)
    values = np.array([0, 3, 10, 12, 99], dtype=np.uint64)
    assert contains(table, values).tolist() == [False, True, False, True, False]
    assert contains(np.empty(0, dtype=np.uint64), values).tolist() == [False] * 5


def test_labels_that_do_not_fit_are_one_line():
    with pytest.raises(ProbeError, match="2 held-out pages but 1 project labels"):
        select(["a b", "c d"], ["A"], np.empty(0, dtype=np.uint64), seed=0)


# --------------------------------------------------------------------------- the shipped corpus
def test_the_project_labels_fit_the_pages():
    """Independently of the counts: a page that names exactly one of the projects names its own
    (all 119 such held-out pages; 6 of 1,119 training pages name another, e.g. Celery's page on
    using Django's cache)."""
    for part, wrong_at_most in (("heldout", 0), ("train", 6)):
        pages, labels = docs_corpus(part), docs_projects(part)
        assert len(labels) == len(pages)
        wrong = 0
        for page, label in zip(pages, labels, strict=True):
            named = [p for p in PROJECTS if p.lower() in page.lower()]
            wrong += len(named) == 1 and named[0] != label
        assert wrong <= wrong_at_most, part


@pytest.fixture(scope="module")
def shipped():
    return {seed: heldout_sample(seed) for seed in (0, 1)}


def test_the_shipped_heldout_text_shares_no_13_words_with_training(shipped):
    """A second implementation: every 13 words of every training page as a tuple, against the
    kept passages (each on its own, and the stream the first 24,576 words of each seed make,
    joins included); the pages with a shared run of 13 words counted the same way."""
    sample = shipped[0]
    kept = {g for doc in sample.docs for g in windows(doc.split())}
    streams = {s: "\n".join(sample.docs).split()[:24576] for s, sample in shipped.items()}
    joined = {g for words in streams.values() for g in windows(words)}
    raw = {g for page in docs_corpus("heldout") for g in windows(page.split())}
    shared_kept, shared_joined, shared_raw = set(), set(), set()
    for page in docs_corpus("train"):
        for gram in windows(page.split()):
            if gram in raw:
                shared_raw.add(gram)
                shared_kept |= {gram} & kept
                shared_joined |= {gram} & joined
    assert not shared_kept and not shared_joined
    cut = sum(bool(set(windows(p.split())) & shared_raw) for p in docs_corpus("heldout"))
    usage = sample.usage(lambda text: len(text.split()), 24576)
    assert usage.pages_cut.sum() == cut == 62
    assert usage.pages.sum() == 147 and 0 < usage.words_dropped.sum() < 0.05 * usage.words.sum()


def test_every_project_is_in_the_measured_text_and_seeds_draw_different_text(shipped):
    """About 32,768 SmolLM2 tokens (24,576 words) of each seed hold text of all twelve projects,
    and the two seeds' samples differ (the same de-duplication)."""
    used = {}
    for seed, sample in shipped.items():
        usage = sample.usage(lambda text: len(text.split()), 24576)
        assert (usage.tokens_used > 0).all() and list(usage.project) == list(PROJECTS)
        assert usage.tokens_used.sum() == 24576
        used[seed] = {page for page, _ in sample.order[:40]}
    assert shipped[0].docs != shipped[1].docs and used[0] != used[1]
    assert [p.passages for p in shipped[0].pages] == [p.passages for p in shipped[1].pages]
