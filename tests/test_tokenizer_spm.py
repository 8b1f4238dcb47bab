"""The SentencePiece tokenizer of a GGUF file (`tokenizer.ggml.model == "llama"`), against three
independent references on the same file:

- llama.cpp's `llm_tokenizer_spm`, transcribed below as plain Python (`llama_cpp_ids`): special
  tokens split out first, a space prefixed to each piece of text after one, " " -> "▁", then the
  pair of highest score merged until none is left, characters outside the vocabulary as bytes;
- transformers' own GGUF tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`);
- SentencePiece itself: a BPE model trained here, written into a GGUF as llama.cpp's converter
  writes one (`_create_vocab_sentencepiece`), and encoded by `sentencepiece`.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from probe.data.text import read_documents
from probe.errors import ProbeError

gguf = pytest.importorskip("gguf")

from probe.interop.tokenizer import gguf_metadata, tokenizer_from_gguf  # noqa: E402

S = "\u2581"  # "▁"
UNK, BOS, EOS = 0, 1, 2
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
WORDS = [f"{S}t", f"{S}th", "he", f"{S}the", "ll", "lo", "llo", f"{S}h", f"{S}he", f"{S}hel",
         f"{S}hello", f"{S}w", "or", "ld", f"{S}wor", f"{S}world", S * 2, S * 3, "ü", f"{S}ü",
         "ab", "ba", "aba", "bab", f"{S}a"]  # fmt: skip
TEXTS = [
    "hello world",
    "  hello   world  ",
    " leading",
    "trailing ",
    "a\nb\n\nc\ttab",
    "héllo 日本語",
    "😀 emoji 👍🏽",
    "über ü",
    "the<think>the",
    "<s>hello</s> world",
    "ababababa babab",
    "",
]


def vocabulary() -> list[tuple[str, float, int]]:
    """(token, score, type): <unk>, <s>, </s>, the 256 byte tokens, then words and characters
    scored as SentencePiece's BPE scores them (every one its own score, earlier merges higher)."""
    vocab = [("<unk>", 0.0, UNKNOWN), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL)]
    vocab += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    vocab += [(w, -float(i), NORMAL) for i, w in enumerate(WORDS)]
    vocab += [(c, -100.0 - i, NORMAL) for i, c in enumerate(S + "abcdefghijklmnopqrstuvwxyz.,")]
    return [*vocab, ("<think>", 0.0, USER_DEFINED)]


def write_gguf(path: Path, vocab, arch: str = "llama", weights=None, **flags) -> Path:
    """A GGUF holding a tokenizer, with the keys llama.cpp's converter writes for one; and the
    tensors of a tiny Llama when `weights` is `test_interop_gguf.tiny_llama()`."""
    w = gguf.GGUFWriter(path, arch)
    if weights is not None:
        _add_llama(w, *weights)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _, _ in vocab])
    w.add_token_scores([s for _, s, _ in vocab])
    w.add_token_types([k for _, _, k in vocab])
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(UNK)
    for key, value in flags.items():
        getattr(w, f"add_{key}")(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_llama(w, weights: dict, dims: dict) -> None:
    from test_interop_gguf import gguf_name, llama_cpp_permute

    w.add_block_count(dims["n_layer"])
    w.add_context_length(32)
    w.add_embedding_length(dims["d_model"])
    w.add_feed_forward_length(dims["d_ff"])
    w.add_head_count(dims["n_head"])
    w.add_head_count_kv(dims["n_kv_head"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    for name, tensor in weights.items():
        n_head = dims["n_head"] if "q_proj" in name else dims["n_kv_head"]
        permuted = "q_proj" in name or "k_proj" in name
        w.add_tensor(gguf_name(name), llama_cpp_permute(tensor, n_head) if permuted else tensor)


def ours(path: Path):
    return tokenizer_from_gguf(gguf_metadata(path, "tokenizer."), path)


def llama_cpp_ids(text, vocab, add_space_prefix=True, add_bos=True, add_eos=False) -> list[int]:
    """llama.cpp's `tokenize` for a SentencePiece vocabulary, transcribed from llama-vocab.cpp."""
    ids = {t: i for i, (t, _, _) in enumerate(vocab)}
    special = [t for t, _, k in vocab if k in (CONTROL, UNKNOWN, USER_DEFINED)]
    fragments: list[str | int] = [text] if text else []
    for token in sorted(special, key=len, reverse=True):  # tokenizer_st_partition
        split: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                split.append(fragment)
                continue
            for j, part in enumerate(fragment.split(token)):
                split += ([ids[token]] if j else []) + ([part] if part else [])
        fragments = split
    out, prev_special = [BOS] if add_bos else [], True
    for fragment in fragments:
        if isinstance(fragment, int):
            out.append(fragment)
            prev_special = True
            continue
        text = (" " if add_space_prefix and prev_special else "") + fragment
        out += _spm_session(text.replace(" ", S), ids, [s for _, s, _ in vocab])
        prev_special = False
    return out + ([EOS] if add_eos else [])


def _spm_session(text: str, ids: dict[str, int], scores: list[float]) -> list[int]:
    """`llm_tokenizer_spm_session::tokenize`: merge the adjacent pair whose text is a token of the
    highest score, the leftmost of equal score, until none is; then bytes for unknown symbols."""
    symbols = list(text)
    while True:
        best = None
        for i in range(len(symbols) - 1):
            token = ids.get(symbols[i] + symbols[i + 1])
            if token is not None and (best is None or scores[token] > best[0]):
                best = (scores[token], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    out = []
    for symbol in symbols:
        out += [ids[symbol]] if symbol in ids else [ids[f"<0x{b:02X}>"] for b in symbol.encode()]
    return out


def random_texts(n: int, seed: int = 0) -> list[str]:
    pieces = [*"abhelowrtü ", "  ", "\n", "é", "日", "😀", "<s>", "</s>", "<think>", "hello"]
    rng = random.Random(seed)
    return ["".join(rng.choices(pieces, k=rng.randint(0, 12))) for _ in range(n)]


@pytest.mark.parametrize("prefix", [True, False])
def test_encode_matches_llama_cpp(prefix, tmp_path):
    vocab = vocabulary()
    tok = ours(write_gguf(tmp_path / "v.gguf", vocab, add_space_prefix=prefix))
    for text in TEXTS + random_texts(300):
        assert tok.encode(text).ids == llama_cpp_ids(text, vocab, prefix), repr(text)


def test_bos_and_eos_follow_the_file_flags(tmp_path):
    vocab = vocabulary()
    for add_bos, add_eos in [(False, True), (True, True), (False, False)]:
        path = write_gguf(tmp_path / f"{add_bos}{add_eos}.gguf", vocab, add_bos_token=add_bos,
                          add_eos_token=add_eos)  # fmt: skip
        got = ours(path).encode("hello").ids
        assert got == llama_cpp_ids("hello", vocab, add_bos=add_bos, add_eos=add_eos)
    assert ours(write_gguf(tmp_path / "none.gguf", vocab)).encode("").ids == [BOS]


def test_probe_import_of_a_llama_2_style_gguf_saves_its_tokenizer(tmp_path):
    """A Llama GGUF with a SentencePiece vocabulary (Llama 2, Mistral, TinyLlama): `probe import`
    writes the tokenizer, and the checkpoint's tokenizer.json encodes as llama.cpp does."""
    from cli_run import exit_code
    from test_interop_gguf import tiny_llama

    from probe.checkpoint import load_checkpoint

    vocab = vocabulary()
    path = write_gguf(tmp_path / "l2.gguf", vocab, weights=tiny_llama(vocab=len(vocab)))
    out = tmp_path / "ckpt"
    assert exit_code(["import", str(path), "--out", str(out)]) == 0
    tok = load_checkpoint(out).tokenizer()
    for text in TEXTS + random_texts(50, seed=2):
        assert tok.encode(text).ids == llama_cpp_ids(text, vocab), repr(text)


@pytest.fixture
def transformers_reference(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()

    def load(path: Path):
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    return load


def test_encode_and_decode_match_transformers(transformers_reference, tmp_path):
    """transformers' Phi-3 GGUF tokenizer prefixes the space as llama.cpp does (a normalizer)."""
    path = write_gguf(tmp_path / "phi3.gguf", vocabulary(), arch="phi3")
    tok, ref = ours(path), transformers_reference(path)
    for text in TEXTS + random_texts(200, seed=1):
        ids = tok.encode(text).ids
        assert ids == ref(text)["input_ids"], repr(text)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), repr(text)
    assert tok.decode(tok.encode(" 日本 😀 ü").ids) == " 日本 😀 ü"


def test_unknown_character_without_byte_tokens_is_unk(tmp_path):
    vocab = [v for v in vocabulary() if v[2] != BYTE]
    tok = ours(write_gguf(tmp_path / "v.gguf", vocab))
    assert tok.encode("hello 日本").ids[-1] == UNK  # unknown characters fused into one <unk>


def test_damaged_vocabularies_are_refused_in_one_line(tmp_path):
    vocab = vocabulary()
    with pytest.raises(ProbeError, match="twice") as e:
        ours(write_gguf(tmp_path / "dup.gguf", [*vocab, ("ab", -1.0, NORMAL)]))
    assert "\n" not in str(e.value)
    meta = gguf_metadata(write_gguf(tmp_path / "v.gguf", vocab), "tokenizer.")
    with pytest.raises(ProbeError, match="lists 3 scores"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.scores": [0.0, 0.0, 0.0]})
    with pytest.raises(ProbeError, match="outside the vocabulary"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.bos_token_id": 10**6})
    with pytest.raises(ProbeError, match="must be a list of numbers"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.scores": ["x"] * len(vocab)})


# --- SentencePiece itself --------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained():
    """A SentencePiece BPE model trained on the shipped corpus: byte fallback, no normalization
    (llama.cpp applies none), a dummy prefix; some characters left out of the vocabulary."""
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(read_documents(None)[:400]),
        model_writer=model,
        model_type="bpe",
        vocab_size=700,
        byte_fallback=True,
        character_coverage=0.995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def sentencepiece_vocab(sp) -> list[tuple[str, float, int]]:
    """The pieces as llama.cpp's converter (`_create_vocab_sentencepiece`) types them."""

    def kind(i):
        for test, k in ((sp.IsUnknown, UNKNOWN), (sp.IsControl, CONTROL), (sp.IsUnused, 5),
                        (sp.IsByte, BYTE)):  # fmt: skip
            if test(i):
                return k
        return NORMAL

    return [(sp.IdToPiece(i), sp.GetScore(i), kind(i)) for i in range(sp.GetPieceSize())]


def test_encode_matches_sentencepiece(trained, tmp_path):
    """On text without control tokens: SentencePiece reads "<s>" in text as characters, llama.cpp
    (and probe) as the control token."""
    tok = ours(write_gguf(tmp_path / "sp.gguf", sentencepiece_vocab(trained)))
    plain = [t for t in TEXTS if "<s>" not in t]
    texts = read_documents(None)[400:700] + plain + ["Ωmega ∑ ⅞ 𝔘nicode", "x  y   z"]
    for text in texts:
        ids = tok.encode(text).ids
        assert ids == [BOS, *trained.encode(text)], repr(text)
        assert tok.decode(ids) == trained.decode(ids[1:]), repr(text)
    everything = [i for t in texts for i in tok.encode(t).ids]
    assert len(everything) > 5_000
    assert any(trained.IsByte(i) for i in everything)  # characters outside the vocabulary met
