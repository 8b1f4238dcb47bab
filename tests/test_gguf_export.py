"""`probe export --format gguf`: a Llama-family model, unpruned, uniformly pruned (llama) or
ragged (deci), written as llama.cpp reads it. Checked four ways: read back by probe's own GGUF
importer (an independent reader, itself checked against llama.cpp's converter on the bundled
SmolLM2 file) to the same logits; read as llama.cpp's graph reads it (a float64 numpy copy of
the `llama` / `deci` graph) to the same logits, layers without heads included; the tokenizer
rebuilt from the file's metadata tokenizes as the original; and, in a slow test, llama.cpp
itself (llama-cpp-python, float32 key/value cache, no flash attention) gives logits as close to
probe's float64 ones as probe's own float32 forward (within 1e-3 or twice its distance) and the
same greedy continuation of 20 tokens for float32 files of SmolLM2 pruned three ways.
(llama.cpp's default float16 cache, and its flash attention, which casts a float32 cache to
float16, move the logits by 1e-2 and more, pruned or not: issue 36.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint
from probe.data.text import read_documents
from probe.errors import ProbeError
from probe.interop.gguf_write import export_gguf, gguf_vocab, layer_heads

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

VOCAB = 320


def bpe_tokenizer():
    """A byte-level BPE tokenizer trained on the shipped corpus (GPT-2's pre-tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(read_documents(None), trainer)
    return tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """An imported tiny Llama (3 layers, 6 query heads in 2 groups of 8 dims) with a BPE
    tokenizer, and copies pruned uniformly and raggedly."""
    root = tmp_path_factory.mktemp("gguf-export")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3,
                                   num_attention_heads=6, num_key_value_heads=2,
                                   intermediate_size=64, tie_word_embeddings=True,
                                   rope_theta=10000.0)  # fmt: skip
    hf = root / "hf"
    transformers.LlamaForCausalLM(cfg).save_pretrained(hf)
    tok = bpe_tokenizer()
    assert tok.get_vocab_size() == VOCAB
    tok.save(str(hf / "tokenizer.json"))
    ckpt = root / "ckpt"
    assert exit_code(["import", str(hf), "--out", str(ckpt)]) == 0
    from probe.pruning.heads import prune_heads

    model = load_checkpoint(ckpt).model
    uniform = prune_heads(model, [(i, h) for i in range(3) for h in (0, 3)])  # 2 of each group
    ragged = prune_heads(model, [(0, 0), (0, 1), (1, 4), (2, 0), (2, 1), (2, 2)])
    return ckpt, uniform, ragged, tok


def _reread_logits(path, tokens):
    """Logits of the GGUF file as probe's own importer reads it."""
    from probe.interop.importer import import_model

    model = import_model(path).model
    with torch.no_grad():
        return model(tokens)


@pytest.mark.parametrize("which", ["unpruned", "uniform"])
def test_llama_files_read_back_to_the_same_logits(tiny, which, tmp_path):
    ckpt, uniform, _, tok = tiny
    model = load_checkpoint(ckpt).model if which == "unpruned" else uniform
    path = tmp_path / "model.gguf"
    result = export_gguf(model, "llama", tok, path, torch.float32)
    assert result.arch == "llama" and result.padded_heads == 0
    tokens = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        want = model(tokens)
    torch.testing.assert_close(_reread_logits(path, tokens), want, rtol=0, atol=1e-5)


def test_a_ragged_model_is_deci_with_per_layer_head_counts(tiny, tmp_path):
    _, _, ragged, tok = tiny
    path = tmp_path / "ragged.gguf"
    result = export_gguf(ragged, "llama", tok, path, torch.float32)
    reader = gguf.GGUFReader(str(path))
    fields = {f.name: f for f in reader.fields.values()}

    def values(name):
        f = fields[name]
        return [int(f.parts[i][0]) for i in f.data]

    assert result.arch == "deci"
    # layer 0 keeps groups of 1 and 3 query heads, layer 1 of 3 and 2: each filled up to 3
    assert values("deci.attention.head_count") == [6, 6, 3]
    assert values("deci.attention.head_count_kv") == [2, 2, 1]
    assert result.padded_heads == 2 + 1
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    assert shapes["blk.0.attn_k.weight"] == (48, 2 * 8)  # GGUF lists the fastest dim first
    assert shapes["blk.2.attn_q.weight"] == (48, 3 * 8)


def test_filler_heads_compute_the_same_function(tiny, tmp_path):
    """Every layer keeping groups of 1 and 3 query heads: written as llama with 6 heads a layer
    (2 of them filler), read back by probe's importer to the pruned model's logits."""
    ckpt, _, _, tok = tiny
    from probe.pruning.heads import prune_heads

    model = prune_heads(load_checkpoint(ckpt).model, [(i, h) for i in range(3) for h in (0, 1)])
    path = tmp_path / "filled.gguf"
    result = export_gguf(model, "llama", tok, path, torch.float32)
    assert result.arch == "llama" and result.heads == (6, 6, 6) and result.padded_heads == 6
    tokens = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        want = model(tokens)
    torch.testing.assert_close(_reread_logits(path, tokens), want, rtol=0, atol=1e-5)


def _graph_logits(path, tokens: list[int]) -> np.ndarray:
    """llama.cpp's `llama` / `deci` graph (src/models/deci.cpp) in float64 numpy, from the file
    alone: per-layer head counts, no attention where a layer has no heads, adjacent rotary
    pairs, query head h reading key/value head h // (heads / kv heads), RMS norms, SwiGLU."""
    reader = gguf.GGUFReader(str(path))
    fields = {f.name: f for f in reader.fields.values()}

    def values(key):  # a scalar is a list of one
        return [fields[key].parts[i][0].item() for i in fields[key].data]

    def value(key):
        return values(key)[0]

    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    n_layer = value(f"{arch}.block_count")
    heads, kv = (values(f"{arch}.attention.{c}") for c in ("head_count", "head_count_kv"))
    heads, kv = (c * n_layer if len(c) == 1 else c for c in (heads, kv))  # llama: one for all
    d = value(f"{arch}.attention.key_length")
    eps = value(f"{arch}.attention.layer_norm_rms_epsilon")
    w = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}  # [out, in]

    def rms(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    n = len(tokens)
    angle = np.arange(n)[:, None] * value(f"{arch}.rope.freq_base") ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]  # [pos, 1, pair]

    def rotate(x):  # [pos, head, d]: pairs (2i, 2i + 1) turned by pos * base^(-2i/d)
        even, odd = x[..., 0::2], x[..., 1::2]
        return np.stack([even * cos - odd * sin, even * sin + odd * cos], -1).reshape(x.shape)

    x = w["token_embd.weight"][tokens]  # [pos, d_model]
    future = np.triu(np.full((n, n), -np.inf), 1)  # [q_pos, k_pos]
    for i in range(n_layer):
        b = f"blk.{i}."
        if heads[i]:
            h = rms(x, w[b + "attn_norm.weight"])
            q = rotate((h @ w[b + "attn_q.weight"].T).reshape(n, heads[i], d))
            k = rotate((h @ w[b + "attn_k.weight"].T).reshape(n, kv[i], d))
            v = (h @ w[b + "attn_v.weight"].T).reshape(n, kv[i], d)
            k, v = (np.repeat(t, heads[i] // kv[i], axis=1) for t in (k, v))  # [pos, head, d]
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + future
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)  # [head, q_pos, k_pos]
            out = np.einsum("hqk,khd->qhd", p, v).reshape(n, heads[i] * d)
            x = x + out @ w[b + "attn_output.weight"].T
        else:
            assert b + "attn_q.weight" not in w  # a layer without heads has no attention
        h = rms(x, w[b + "ffn_norm.weight"])
        gate, up = h @ w[b + "ffn_gate.weight"].T, h @ w[b + "ffn_up.weight"].T  # [pos, d_ff]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[b + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    return rms(x, w["output_norm.weight"]) @ out.T  # [pos, vocab]


@pytest.mark.parametrize(
    "pruned",
    [
        [],  # llama
        [(0, h) for h in range(6)] + [(1, 2)],  # no heads in layer 0 (one filler head)
        [(0, 0), (0, 1)] + [(1, h) for h in range(6)] + [(2, 3), (2, 4), (2, 5)],  # none in 1
    ],
    ids=["unpruned", "first layer without heads", "unequal groups, a layer without heads"],
)
def test_files_compute_the_pruned_function_as_llama_cpp_reads_them(tiny, pruned, tmp_path):
    """The file as llama.cpp's graph reads it (`_graph_logits`, float64) gives the pruned
    model's logits: deci's layers without heads, filler heads, the rotary permutation."""
    from probe.pruning.heads import prune_heads

    ckpt, _, _, tok = tiny
    model = prune_heads(load_checkpoint(ckpt).model, pruned)
    path = tmp_path / "m.gguf"
    result = export_gguf(model, "llama", tok, path, torch.float32)
    assert result.arch == ("deci" if pruned else "llama")
    tokens = list(range(5, 30))
    with torch.no_grad():
        want = model.double()(torch.tensor([tokens]))[0].numpy()
    np.testing.assert_allclose(_graph_logits(path, tokens), want, rtol=0, atol=1e-5)


def test_unequal_groups_are_filled_up_to_the_largest():
    class Module:
        def __init__(self, kv):
            self.kv_index = torch.tensor(kv)

    class Model:
        def __init__(self, layers):
            self.layers = layers

        def attention_modules(self):
            return [Module(kv) for kv in self.layers]

    assert layer_heads(Model([[], [0, 1]])) == [([None], [None]), ([0, 1], [0, 1])]
    plan = layer_heads(Model([[0, 0, 1, 1], [0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1], []]))
    assert plan == [
        ([0, 1, 2, 3], [0, 1]),
        ([0, 1, 2, 3, 4, None, 5, 6, None], [0, 1, 2]),
        ([0, None, None, 1, 2, 3], [0, 1]),
        ([], []),
    ]


def test_the_tokenizer_in_the_file_tokenizes_as_the_original(tiny, tmp_path):
    ckpt, _, _, tok = tiny
    path = tmp_path / "model.gguf"
    export_gguf(load_checkpoint(ckpt).model, "llama", tok, path)
    from probe.interop.tokenizer import gguf_metadata, tokenizer_from_gguf

    rebuilt = tokenizer_from_gguf(gguf_metadata(path), path)
    for doc in read_documents(None)[:50]:
        assert rebuilt.encode(doc).ids == tok.encode(doc).ids


def test_end_of_text_and_begin_tokens(tiny):
    from tokenizers import processors

    tok = tiny[3]
    vocab = gguf_vocab(tok, VOCAB)
    assert vocab.pre == "gpt-2" and vocab.bos is None  # GPT-2's split; nothing added first
    assert vocab.tokens[vocab.eos] == "<|endoftext|>" and vocab.types[vocab.eos] == 3
    assert gguf_vocab(tok, VOCAB, eos=7).eos == 7  # what the model's source says wins
    wrapped = bpe_tokenizer()
    wrapped.add_special_tokens(["<s>", "</s>"])
    wrapped.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", VOCAB), ("</s>", VOCAB + 1)])  # fmt: skip
    vocab = gguf_vocab(wrapped, VOCAB + 2)
    assert (vocab.tokens[vocab.bos], vocab.tokens[vocab.eos]) == ("<s>", "</s>")
    bare = bpe_tokenizer()
    bare.add_tokens(["plain"])  # an added token, not special
    doc = json.loads(bare.to_str())
    doc["added_tokens"] = [t for t in doc["added_tokens"] if not t["special"]]
    from tokenizers import Tokenizer

    with pytest.raises(ProbeError, match="EOS"):
        gguf_vocab(Tokenizer.from_str(json.dumps(doc)), VOCAB + 1)


def test_smollm2_tokenizer_survives_the_trip(tmp_path):
    """SmolLM2's tokenizer (digits split, then GPT-2's regex) written and read back."""
    from probe.interop.bundled import bundled_path
    from probe.interop.tokenizer import gguf_metadata, tokenizer_from_gguf

    try:
        source = bundled_path("smollm2")
    except ProbeError as exc:
        pytest.skip(str(exc))
    original = tokenizer_from_gguf(gguf_metadata(source), source)
    vocab = gguf_vocab(original, original.get_vocab_size())
    assert vocab.pre == "starcoder"  # llama.cpp's name for the \p{N} + GPT-2 split
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": vocab.pre,
            "tokenizer.ggml.tokens": vocab.tokens, "tokenizer.ggml.token_type": vocab.types,
            "tokenizer.ggml.merges": vocab.merges}  # fmt: skip
    rebuilt = tokenizer_from_gguf(meta)
    text = "Version 3.11 of the 2024 release costs $12.50 - doesn't it?\n  indented"
    for doc in [text, *read_documents(None)[:20]]:
        assert rebuilt.encode(doc).ids == original.encode(doc).ids


def test_export_gguf_cli_and_bad_input(tiny, tmp_path, capsys):
    ckpt = tiny[0]
    out = tmp_path / "m.gguf"
    assert exit_code(["export", str(ckpt), "--format", "gguf", "--out", str(out),
                      "--dtype", "bfloat16"]) == 0  # fmt: skip
    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "BF16" and types["blk.0.attn_norm.weight"] == "F32"
    from test_cli_imported import hf_dir

    bert = tmp_path / "bert"
    assert exit_code(["import", str(hf_dir("bert-mlm", tmp_path)), "--out", str(bert)]) == 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        ([str(ckpt), "--out", str(out)], "exists"),
        ([str(bert), "--out", str(tmp_path / "b.gguf")], "Llama-family"),
        ([str(ckpt), "--out", str(blocker / "m.gguf")], "is a file"),
        ([str(ckpt), "--out", str(tmp_path)], "is a directory"),
    ]
    for args, words in cases:
        capsys.readouterr()
        assert exit_code(["export", *args, "--format", "gguf"]) == 2, args
        err = capsys.readouterr().err
        assert words in err.replace("\n", " ") and "Traceback" not in err, (args, err)
    assert not list(tmp_path.glob("*.probe-tmp"))


# ------------------------------------------------------------------------------- llama.cpp itself
NO_LLAMA_CPP = ("llama-cpp-python is not installed (.ci/run builds it from its PyPI source "
                "release and caches the wheel)")  # fmt: skip


def _llama_cpp_logits(path, tokens):
    llama_cpp = pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False,
                          n_threads=1, type_k=0, type_v=0)  # fmt: skip
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["unpruned", "first layer without heads"])
def test_llama_cpp_runs_tiny_files_with_gpt2_tokenizers(tiny, which, tmp_path):
    """GPT-2's pre-tokenizer named as llama.cpp knows it ("gpt-2"), and a deci file whose
    first layer keeps no head (llama.cpp reads the head size off layer 0)."""
    from probe.pruning.heads import prune_heads

    ckpt, _, _, tok = tiny
    model = load_checkpoint(ckpt).model
    if which != "unpruned":
        model = prune_heads(model, [(0, h) for h in range(6)] + [(1, 2)])
    path = tmp_path / "m.gguf"
    export_gguf(model, "llama", tok, path, torch.float32)
    tokens = list(range(5, 30))
    with torch.no_grad():
        want = model(torch.tensor([tokens]))[0].numpy()
    assert np.abs(_llama_cpp_logits(path, tokens) - want).max() < 1e-3


@pytest.fixture(scope="module")
def smollm2_files(tmp_path_factory):
    """SmolLM2 imported, pruned by a third at random (ragged, uniformly, and by whole key/value
    groups, leaving a layer without heads), as float32 GGUF."""
    pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)
    from probe.interop.bundled import bundled_path

    try:
        bundled_path("smollm2")
    except ProbeError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("smollm2-gguf")
    ckpt = root / "smollm2"
    assert exit_code(["import", "bundled:smollm2", "--out", str(ckpt)]) == 0
    out = {}
    for name, extra in (("ragged", []), ("uniform", ["--uniform"]),
                        ("groups", ["--unit", "group"])):  # fmt: skip
        pruned = root / name
        assert exit_code(["prune", str(ckpt), "--method", "random", "--fraction", "0.3333",
                          "--no-timing", "--batch-size", "2", "--batches", "1", "--max-tokens",
                          "32", *extra, "--out", str(pruned)]) == 0  # fmt: skip
        path = root / f"{name}.gguf"
        assert exit_code(["export", str(pruned), "--format", "gguf", "--out", str(path)]) == 0
        out[name] = (pruned, path)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, arch", [("ragged", "deci"), ("uniform", "llama"),
                                        ("groups", "deci")])  # fmt: skip
def test_llama_cpp_runs_the_pruned_file_with_probes_logits(smollm2_files, name, arch):
    from llama_cpp import Llama

    from probe.measure.generate import generate

    ckpt, path = smollm2_files[name]
    reader = gguf.GGUFReader(str(path))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == arch
    if name == "groups":  # a layer without heads, written as deci's attention-free layer
        counts = reader.fields["deci.attention.head_count"]
        assert 0 in [int(counts.parts[i][0]) for i in counts.data]
    model = load_checkpoint(ckpt).model
    prompt = load_checkpoint(ckpt).tokenizer().encode(read_documents(None)[3]).ids[:48]
    llm = Llama(
        model_path=str(path),
        n_ctx=256,
        logits_all=True,
        verbose=False,
        n_threads=2,
        type_k=0,
        type_v=0,
    )  # fmt: skip  (float32 key/value cache, as probe's)
    llm.eval(prompt)
    got = np.array(llm.scores[: len(prompt)])
    with torch.no_grad():
        want = model(torch.tensor([prompt]))[0].double().numpy()
        exact = load_checkpoint(ckpt).model.double()(torch.tensor([prompt]))[0].numpy()
    # as close to the exact (float64) logits as probe's own float32 forward: within 1e-3, or
    # twice probe's distance where a pruned model's logits are that sensitive to rounding
    own = np.abs(want - exact).max()
    assert np.abs(got - exact).max() <= max(1e-3, 2 * own), (np.abs(got - exact).max(), own)
    continued = generate(model, torch.tensor([prompt]), 20)[0, len(prompt) :].tolist()
    llm.reset()
    theirs = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        theirs.append(token)
        if len(theirs) == 20:
            break
    assert theirs == continued
