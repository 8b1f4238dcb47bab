"""Every command on imported models, through the real CLI: import, info, inspect, importance,
prune (by head, by group, uniform), prune --sweep, and export back to transformers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from cli_run import exit_code

from probe.checkpoint import load_checkpoint
from probe.data.text import read_documents

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = 99


def word_tokenizer(bert: bool):
    """A word-level tokenizer over the shipped corpus's most common words (VOCAB ids in all)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = Counter(w for doc in read_documents(None) for w in doc.lower().split())
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for w, _ in words.most_common(VOCAB - len(SPECIAL)):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.normalizer = tokenizers.normalizers.Lowercase()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    return tok


def hf_dir(kind: str, root: Path) -> Path:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=64,
            tie_word_embeddings=True,
        )
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=64,
        )
        if kind == "bert-mlm":
            model = transformers.BertForMaskedLM(cfg)
        else:
            model = transformers.BertModel(cfg, add_pooling_layer=False)
    path = root / kind
    model.save_pretrained(path)
    word_tokenizer(kind != "llama").save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("imported")
    out = {}
    for kind in ("llama", "bert-mlm", "bert"):
        ckpt = root / f"{kind}-ckpt"
        assert exit_code(["import", str(hf_dir(kind, root)), "--out", str(ckpt)]) == 0
        out[kind] = ckpt
    return out


TEXT = ["--max-tokens", "16", "--batch-size", "4"]


def test_inspect_importance_and_sweep_on_a_gqa_model(imported, tmp_path, capsys):
    ckpt = imported["llama"]
    assert exit_code(["info", str(ckpt)]) == 0
    assert "key/value groups kept" in capsys.readouterr().out
    out = tmp_path / "inspect"
    assert (
        exit_code(
            [
                "inspect",
                str(ckpt),
                "--out",
                str(out),
                "--lengths",
                "8,16",
                "--batch-size",
                "4",
                "--batches",
                "1",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["model_type"] == "llama" and manifest["text"] == "shipped corpus"
    stats = (out / "attention_stats.csv").read_text()
    assert "blocks.1.attn" in stats
    roles = (out / "roles.csv").read_text()
    assert "retrieval" in roles and "induction" in roles
    assert manifest["needle_prompts"] == 4
    imp = tmp_path / "imp"
    assert (
        exit_code(["importance", str(ckpt), "--out", str(imp), "--method", "ablation", *TEXT]) == 0
    )
    sweep = tmp_path / "sweep"
    code = exit_code(
        [
            "prune",
            str(ckpt),
            "--sweep",
            "--out",
            str(sweep),
            "--seeds",
            "2",
            "--methods",
            "gradient",
            "--fractions",
            "0,0.5",
            *TEXT,
        ]
    )
    assert code == 0
    curve = (sweep / "pruning.csv").read_text()
    assert "perplexity" in curve and "loss" in curve


def test_prune_uniform_exports_and_transformers_computes_the_same(imported, tmp_path, capsys):
    ckpt = imported["llama"]
    pruned, hf = tmp_path / "pruned", tmp_path / "hf"
    assert (
        exit_code(
            [
                "prune",
                str(ckpt),
                "--out",
                str(pruned),
                "--fraction",
                "0.34",
                "--uniform",
                "--no-timing",
                *TEXT,
            ]
        )
        == 0
    )
    loaded = load_checkpoint(pruned)
    for site in loaded.model_cfg.sites():  # one of the three heads of each group went
        assert len(site.kept_heads) == 4 and len(site.kept_groups) == 2
    # 4 of 12 heads is 33%: the share achieved, and the one asked for beside it
    assert "pruning 4 of 12 heads (33%; 34% asked)" in " ".join(capsys.readouterr().out.split())
    assert (pruned / "tokenizer.json").is_file()
    assert exit_code(["export", str(pruned), "--out", str(hf)]) == 0
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf)).eval()
    assert ref.config.num_attention_heads == 4 and ref.config.num_key_value_heads == 2
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ref(tokens).logits - loaded.model(tokens)).abs().max() < 1e-4


def test_prune_whole_groups_and_a_shape_export_cannot_hold(imported, tmp_path, capsys):
    ckpt = imported["llama"]
    groups = tmp_path / "groups"
    assert (
        exit_code(
            [
                "prune",
                str(ckpt),
                "--out",
                str(groups),
                "--fraction",
                "0.5",
                "--unit",
                "group",
                "--no-timing",
                *TEXT,
            ]
        )
        == 0
    )
    sites = load_checkpoint(groups).model_cfg.sites()
    assert sum(len(s.kept_groups) for s in sites) == 2  # 2 of the 4 groups, 3 heads each
    assert all(len(s.kept_heads) == 3 * len(s.kept_groups) for s in sites)
    ragged = tmp_path / "ragged"
    assert (
        exit_code(
            ["prune", str(ckpt), "--out", str(ragged), "--fraction", "0.25", "--no-timing", *TEXT]
        )
        == 0
    )
    capsys.readouterr()
    assert exit_code(["export", str(ragged), "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "--uniform" in err and "Traceback" not in err


def test_masked_lm_and_sentence_encoder_objectives(imported, tmp_path, capsys):
    mlm = tmp_path / "mlm"
    assert (
        exit_code(
            [
                "prune",
                str(imported["bert-mlm"]),
                "--out",
                str(mlm),
                "--fraction",
                "0.25",
                "--no-timing",
                *TEXT,
            ]
        )
        == 0
    )
    metrics = (mlm / "prune_metrics.csv").read_text()
    assert "perplexity" in metrics
    enc = tmp_path / "enc"
    capsys.readouterr()
    assert exit_code(["prune", str(imported["bert"]), "--out", str(enc), "--no-timing", *TEXT]) == 2
    assert "use --method ablation" in capsys.readouterr().err
    assert (
        exit_code(
            [
                "prune",
                str(imported["bert"]),
                "--out",
                str(enc),
                "--method",
                "ablation",
                "--fraction",
                "0.25",
                "--no-timing",
                *TEXT,
            ]
        )
        == 0
    )
    assert "similarity" in (enc / "prune_metrics.csv").read_text()


def test_text_options_are_checked(imported, tmp_path, capsys):
    text = tmp_path / "doc.txt"
    text.write_text("\n".join(read_documents(None)[:40]))
    out = tmp_path / "imp"
    assert (
        exit_code(
            ["importance", str(imported["llama"]), "--out", str(out), "--text", str(text), *TEXT]
        )
        == 0
    )
    assert json.loads((out / "manifest.json").read_text())["settings"]["text"] == str(text)
    capsys.readouterr()
    code = exit_code(
        ["importance", str(imported["llama"]), "--out", str(tmp_path / "x"), "--lengths", "3,4"]
    )
    assert code == 2 and "drop --lengths" in capsys.readouterr().err
    code = exit_code(
        [
            "importance",
            str(imported["llama"]),
            "--out",
            str(tmp_path / "y"),
            "--max-tokens",
            "100000",
        ]
    )
    assert code == 2 and "tokens" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("only a few words here\n")
    code = exit_code(
        [
            "importance",
            str(imported["llama"]),
            "--out",
            str(tmp_path / "z"),
            "--text",
            str(short),
            *TEXT,
        ]
    )
    assert code == 2 and "fewer than one row" in capsys.readouterr().err


def test_importance_per_group_is_the_sum_of_its_heads(imported, tmp_path):
    out = tmp_path / "groups"
    code = exit_code(["importance", str(imported["llama"]), "--out", str(out), "--method",
                      "ablation", "--unit", "group", *TEXT])  # fmt: skip
    assert code == 0
    import pandas as pd

    heads = pd.read_csv(out / "importance.csv")
    groups = pd.read_csv(out / "importance_groups.csv")
    assert len(groups) == 2 * 2  # 2 layers x 2 key/value groups
    for r in groups.itertuples():  # 6 query heads, 3 per group: heads 3g .. 3g+2
        part = heads[(heads.layer == r.layer) & (heads["head"] // 3 == r.group)]
        assert abs(part["value"].sum() - r.score) < 1e-9


def test_import_bad_sources_give_one_line(tmp_path, capsys):
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    empty = tmp_path / "empty"
    empty.mkdir()
    import importlib.util

    has_gguf = importlib.util.find_spec("gguf") is not None  # an optional package
    for source, words in (
        (gguf, "truncated or corrupt" if has_gguf else "needs the gguf package"),
        (notes, "import a Hugging Face"),
        (empty, "config.json is missing"),
        (tmp_path / "nope", "does not exist"),
    ):
        capsys.readouterr()
        assert exit_code(["import", str(source), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "out").exists()  # nothing written for a failed import


def test_eval_on_text_and_a_pruned_encoder_against_its_original(imported, tmp_path):
    import pandas as pd

    out = tmp_path / "eval"
    assert exit_code(["eval", str(imported["llama"]), "--out", str(out), "--lengths", "8,16",
                      "--batch-size", "4", "--batches", "1"]) == 0  # fmt: skip
    table = pd.read_csv(out / "eval.csv")
    assert set(table.metric) == {"loss", "perplexity"} and set(table.length) == {8, 16}
    loss = table[(table.metric == "loss") & (table.length == 16)].value.item()
    perplexity = table[(table.metric == "perplexity") & (table.length == 16)].value.item()
    assert abs(perplexity - float(torch.tensor(loss).exp())) < 1e-3 * perplexity
    pruned = tmp_path / "pruned"
    assert exit_code(["prune", str(imported["bert"]), "--out", str(pruned), "--method", "ablation",
                      "--fraction", "0.5", "--no-timing", *TEXT]) == 0  # fmt: skip
    for ckpt, name in ((imported["bert"], "same"), (pruned, "pruned")):
        assert exit_code(["eval", str(ckpt), "--out", str(tmp_path / f"{name}-eval"), "--lengths",
                          "16", "--batch-size", "4", "--batches", "1"]) == 0  # fmt: skip
    same = pd.read_csv(tmp_path / "same-eval" / "eval.csv").set_index("metric")["value"]
    after = pd.read_csv(tmp_path / "pruned-eval" / "eval.csv").set_index("metric")["value"]
    assert abs(same["similarity"] - 1.0) < 1e-5 and same["neighbours"] == 1.0
    assert after["similarity"] < same["similarity"] - 1e-6  # half the heads gone: it moved
    assert 0.0 <= after["neighbours"] <= 1.0


def test_fisher_tuned_and_layer_drop_pruning(imported, tmp_path):
    import pandas as pd

    tuned, layers = tmp_path / "tuned", tmp_path / "layers"
    assert exit_code(["prune", str(imported["llama"]), "--out", str(tuned), "--method", "fisher",
                      "--tune", "--fraction", "0.5", "--no-timing", *TEXT]) == 0  # fmt: skip
    metrics = pd.read_csv(tuned / "prune_metrics.csv").set_index(["variant", "metric"])["value"]
    assert abs(metrics[("masked", "loss")] - metrics[("pruned", "loss")]) < 1e-4
    assert sum(len(s.kept_heads) for s in load_checkpoint(tuned).model_cfg.sites()) == 6
    assert exit_code(["prune", str(imported["llama"]), "--out", str(layers), "--unit", "layer",
                      "--fraction", "0.5", "--no-timing", *TEXT]) == 0  # fmt: skip
    kept = [len(s.kept_heads) for s in load_checkpoint(layers).model_cfg.sites()]
    assert sorted(kept) == [0, 6]
    imp = tmp_path / "imp"
    assert exit_code(["importance", str(imported["llama"]), "--out", str(imp), "--method",
                      "fisher", "--unit", "layer", *TEXT]) == 0  # fmt: skip
    assert len(pd.read_csv(imp / "importance_layers.csv")) == 2


def test_sweep_by_key_value_group(imported, tmp_path):
    import pandas as pd

    out = tmp_path / "sweep"
    assert exit_code(["prune", str(imported["llama"]), "--sweep", "--out", str(out), "--unit",
                      "group", "--methods", "gradient", "--seeds", "1", "--fractions",
                      "0,0.5,1", *TEXT]) == 0  # fmt: skip
    curve = pd.read_csv(out / "pruning.csv")
    assert set(curve.n_pruned) == {0, 6, 12}  # 0, 2 and 4 of the 4 groups of 3 query heads
    assert json.loads((out / "manifest.json").read_text())["settings"]["unit"] == "group"


def test_needle_prompts_too_long_for_the_text_say_how_to_turn_them_off(imported, tmp_path, capsys):
    text = tmp_path / "doc.txt"
    text.write_text(" ".join(" ".join(read_documents(None)[:3]).split()[:50]) + "\n")
    args = ["inspect", str(imported["llama"]), "--text", str(text), "--lengths", "8",
            "--batch-size", "2", "--batches", "1"]  # fmt: skip
    capsys.readouterr()
    assert exit_code([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "needle prompts" in err and "--needles 0 turns the needle prompts off" in err, err
    assert exit_code([*args, "--needles", "0", "--out", str(tmp_path / "b")]) == 0
