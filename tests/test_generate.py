"""Cached generation (`probe.measure.generate`, `probe generate`): greedy decoding equals the
argmax of the full forward recomputed at every step without a cache; sampling equals drawing from
the full forward's softmax with the same generator, and a seed reproduces it; `--check` passes on a
tiny model of every family and names the step when the cache is corrupted; bad input is one line."""

from __future__ import annotations

import pytest
import torch
from cli_run import exit_code
from family_models import FAMILIES, save_tiny
from test_kv_cache import CONFIGS, tiny

from probe.config import ModelConfig
from probe.errors import ProbeError
from probe.measure.generate import check_tolerance, generate
from probe.model import Transformer
from probe.model.cache import SiteCache

PROMPT = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(7))


@torch.no_grad()
def uncached(model, tokens, n, temperature=None, seed=0):
    """The reference: the whole sequence through the full forward at every step, no cache."""
    gen = torch.Generator().manual_seed(seed)
    seq = tokens
    for _ in range(n):
        logits = model(seq)[:, -1].float()  # [batch, vocab]
        if temperature is None:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


@pytest.mark.parametrize("name", ["rope-gqa", "alibi", "t5", "window", "gemma2-like", "learned"])
def test_greedy_equals_the_argmax_of_the_full_forward_at_every_step(name):
    model = tiny(**CONFIGS[name])
    out = generate(model, PROMPT, 12)
    assert out.shape == (2, 17)
    assert torch.equal(out, uncached(model, PROMPT, 12))


def test_sampling_draws_from_the_full_forwards_softmax_and_a_seed_reproduces_it():
    model = tiny(**CONFIGS["rope-gqa"])
    one = generate(model, PROMPT, 16, greedy=False, temperature=1.5, seed=3)
    assert torch.equal(one, uncached(model, PROMPT, 16, temperature=1.5, seed=3))
    assert torch.equal(one, generate(model, PROMPT, 16, greedy=False, temperature=1.5, seed=3))
    other = generate(model, PROMPT, 16, greedy=False, temperature=1.5, seed=4)
    assert not torch.equal(one, other)
    assert not torch.equal(one, generate(model, PROMPT, 16))  # not the greedy continuation


def test_eos_ends_a_row_and_stops_when_every_row_has_it():
    model = tiny(**CONFIGS["alibi"])
    greedy = uncached(model, PROMPT[:1], 8)
    eos = int(greedy[0, 5 + 3])  # the fourth new token
    first = int((greedy[0, 5:] == eos).nonzero()[0])  # it may come earlier
    out = generate(model, PROMPT[:1], 8, eos=eos)
    assert torch.equal(out, greedy[:, : 5 + first + 1])


def test_a_prepared_cache_is_filled_in_place():
    model = tiny(**CONFIGS["rope-gqa"])
    cache = model.new_cache()
    generate(model, PROMPT, 4, cache=cache)
    kv, d = model.cfg.kv_heads, model.cfg.d_head
    assert cache.length == 5 + 3  # the last token is chosen, never fed
    assert cache.nbytes == 2 * 2 * (2 * kv * 8 * d) * 4  # layers x (k, v) x float32 elements
    with pytest.raises(ProbeError, match="already holds 8 tokens"):
        generate(model, PROMPT, 4, cache=cache)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_check_passes_on_every_positional_encoding(name):
    model = tiny(**CONFIGS[name])
    generate(model, PROMPT, 8, check=True)


@pytest.mark.parametrize("kind", ["llama", *FAMILIES])
def test_check_passes_on_a_tiny_model_of_every_family(kind, tmp_path):
    pytest.importorskip("transformers")
    from test_cli_imported import hf_dir

    from probe.interop.importer import import_model

    source = hf_dir("llama", tmp_path) if kind == "llama" else save_tiny(kind, tmp_path)
    model = import_model(source).model
    prompt = torch.randint(0, 99, (2, 4), generator=torch.Generator().manual_seed(5))
    generate(model, prompt, 10, check=True)  # past every sliding window (6)


def test_check_names_the_step_where_a_corrupted_cache_differs(monkeypatch):
    model = tiny(**CONFIGS["rope-gqa"])
    append = SiteCache.append

    def corrupted(self, k, v):
        out = append(self, k, v)  # this step's attention sees the right keys
        if self.k.shape[2] >= 6:  # from the first new token on, the stored keys are wrong
            self.k = self.k + 0.5
        return out

    monkeypatch.setattr(SiteCache, "append", corrupted)
    with pytest.raises(ProbeError, match="at step 2 "):
        generate(model, PROMPT, 6, check=True)


def test_a_half_dtype_checks_against_its_own_rounding():
    assert check_tolerance(torch.float32) == 1e-4
    assert check_tolerance(torch.bfloat16) == 8 * 2**-7
    model = tiny(**CONFIGS["rope-gqa"]).to(torch.bfloat16)
    generate(model, PROMPT, 8, check=True)


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(max_new_tokens=0), "--max-new-tokens must be at least 1"),
        (dict(max_new_tokens=3, greedy=False, temperature=0.0), "--temperature must be above 0"),
        (dict(max_new_tokens=70), "64 learned positions"),
    ],
)
def test_bad_requests_are_one_line(kw, fragment):
    model = tiny(**CONFIGS["learned"])
    with pytest.raises(ProbeError, match=fragment):
        generate(model, PROMPT, **kw)
    with pytest.raises(ProbeError, match="prompt is empty"):
        generate(model, PROMPT[:, :0], 3)
    with pytest.raises(ProbeError, match=r"must lie in 0\.\.39"):
        generate(model, PROMPT + 40, 3)


def test_an_encoder_does_not_generate():
    with pytest.raises(ProbeError, match="needs a decoder"):
        generate(tiny(arch="encoder"), PROMPT, 3)


# ---------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("transformers")
    from test_cli_bad_input import make_checkpoint
    from test_cli_imported import hf_dir

    root = tmp_path_factory.mktemp("generate")
    llama = root / "llama-ckpt"
    assert exit_code(["import", str(hf_dir("llama", root)), "--out", str(llama)]) == 0
    bare = root / "bare-ckpt"
    assert exit_code(["import", str(root / "llama"), "--out", str(bare)]) == 0
    (bare / "tokenizer.json").unlink()
    bert = root / "bert-ckpt"
    assert exit_code(["import", str(hf_dir("bert-mlm", root)), "--out", str(bert)]) == 0
    trained = make_checkpoint(root / "trained", arch="decoder")
    return {"llama": llama, "bare": bare, "bert": bert, "trained": trained}


def test_generate_prints_the_continuation_speed_and_cache_bytes(checkpoints, capsys):
    from probe.checkpoint import load_checkpoint

    ckpt = checkpoints["llama"]
    args = ["generate", str(ckpt), "--prompt", "the module is", "--max-new-tokens", "5"]
    assert exit_code([*args, "--check"]) == 0
    out = capsys.readouterr().out
    loaded = load_checkpoint(ckpt)
    ids = loaded.tokenizer().encode("the module is").ids
    expected = uncached(loaded.model, torch.tensor([ids]), 5)[0, len(ids) :].tolist()
    lines = out.strip().splitlines()
    assert lines[0] == loaded.tokenizer().decode(expected)
    cfg = loaded.model_cfg
    nbytes = cfg.n_layer * 2 * cfg.kv_heads * cfg.d_head * (len(ids) + 4) * 4
    assert "tokens/s" in lines[-1] and f"key/value cache {nbytes:,} bytes" in lines[-1]
    assert exit_code([*args, "--temperature", "0.8", "--seed", "1"]) == 0


def test_a_trained_model_takes_token_ids(checkpoints, capsys):
    args = ["generate", str(checkpoints["trained"]), "--tokens", "1,2,3", "--max-new-tokens", "4"]
    assert exit_code(args) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert len(first.split(",")) == 4 and all(t.isdigit() for t in first.split(","))


@pytest.mark.parametrize(
    "name, extra, fragment",
    [
        ("bare", ["--prompt", "the"], "no tokenizer.json"),
        ("llama", ["--prompt", "  "], "--prompt is empty"),
        ("llama", ["--prompt", "the", "--max-new-tokens", "0"], "at least 1"),
        ("llama", ["--prompt", "the", "--temperature", "0"], "--temperature must be above 0"),
        ("llama", ["--prompt", "the", "--greedy", "--temperature", "1"], "exclude each other"),
        ("llama", [], "--prompt TEXT or as --tokens"),
        ("llama", ["--tokens", "1,x"], "comma-separated token ids"),
        ("llama", ["--tokens", "1,500"], "must lie in 0..98"),
        ("bert", ["--prompt", "the"], "needs a decoder"),
        ("trained", ["--prompt", "the"], "--tokens 1,2,3"),
    ],
)
def test_bad_input_is_one_line(checkpoints, capsys, name, extra, fragment):
    assert exit_code(["generate", str(checkpoints[name]), *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in " ".join(err.split()) and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # one line (rich may wrap a long path once)


def test_generation_under_a_plan_checks_against_the_masked_full_forward(tmp_path):
    """`--kv-plan`: the cache evicts the streaming heads to sink + window, and --check compares
    every step with the full forward under the same plan; greedy tokens equal an uncached loop
    over that masked forward, and the cache holds fewer bytes than the full one."""
    from probe.kv.plan import KVPlan
    from probe.measure.generate import generate

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=30, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pe="rope")
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    plan = KVPlan("random", 0.5, sink=1, window=3, full=((0,), (1,)))
    prompt = torch.randint(0, 30, (1, 9), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(plan)
    out = generate(model, prompt, 6, check=True, cache=cache, plan=plan)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            nxt = model(seq, plan=plan)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)
    full = model.new_cache()
    generate(model, prompt, 6, cache=full)
    assert cache.nbytes < full.nbytes
