"""Rotary sections at the edges of what transformers reads (found by an adversarial pass): a
top-level `original_max_position_embeddings` wins over the section's, as transformers 5.25
reads it (logits against transformers itself); what transformers reads otherwise than the
file says (YaRN's truncate in a section per layer type, sections per layer type in a family
with one rotary) or cannot load (YaRN without its factor key, a null rope_type or rope_theta,
Phi-3's "su" elsewhere) is refused in one line naming the key."""

from __future__ import annotations

import json

import pytest
import torch

from probe.errors import ProbeError
from probe.interop.importer import import_model

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, intermediate_size=48)  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "rope_theta": 10000.0}  # fmt: skip


pytestmark = pytest.mark.usefixtures("quiet_transformers")


def saved_llama(path, top: dict | None = None, section: dict | None = None):
    """A tiny Llama (weights of std 0.2: attention far from uniform) with `section` as its
    rope_parameters and `top` merged into config.json's top level."""
    cfg = transformers.LlamaConfig(**SHAPE, max_position_embeddings=64,
                                   rope_parameters=dict(section or YARN))  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **(top or {})}))
    return path


@pytest.mark.parametrize(
    "section",
    [
        YARN,
        {
            **YARN,
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    ],
)
def test_a_top_level_original_context_wins_as_transformers_reads_it(section, tmp_path):
    path = saved_llama(tmp_path / "m", {"original_max_position_embeddings": 16}, section)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert ref.config.rope_parameters["original_max_position_embeddings"] == 16
    ours = import_model(path).model.eval()
    assert ours.cfg.rope_scaling.original_max_position_embeddings == 16
    x = torch.randint(0, 99, (1, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((ours(x) - ref(x).logits).abs().max()) < 1e-4


def _edited(path, **changes):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"rope_parameters": {"full_attention": YARN}},
         "rope_parameters = ['full_attention']: a rotary section per layer type; this family"),
        ({"rope_parameters": {k: v for k, v in YARN.items() if k != "factor"}},
         "YaRN needs a 'factor' key"),
        ({"rope_parameters": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
         "Unknown rotary scaling kind 'su'"),
        ({"rope_parameters": {"rope_type": None, "type": "linear", "factor": 2.0}},
         "rope_parameters.rope_type must be a string, got null"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": None}},
         "rope_parameters.rope_theta must be a number, got null"),
        ({"rope_parameters": {"rope_type": "linear", "type": "yarn", "factor": 2.0}},
         "rope_parameters.type = 'yarn': it disagrees with rope_type 'linear'"),
    ],
)  # fmt: skip
def test_what_transformers_reads_otherwise_or_cannot_load_is_one_line(changes, words, tmp_path):
    path = _edited(saved_llama(tmp_path / "m"), **changes)
    with pytest.raises(ProbeError) as err:
        import_model(path)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_yarn_truncate_false_in_a_section_per_layer_type_is_refused(tmp_path):
    """transformers reads truncate from the top of rope_parameters, so in OLMo-3's (or Gemma
    3's) per-layer-type sections it always truncates: a false there is refused."""
    from family_models import save_tiny

    path = save_tiny("olmo3", tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"]["full_attention"]["truncate"] = False
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ProbeError, match="truncate = False: transformers reads YaRN's truncate"):
        import_model(path)


def test_phi3_names_the_kind_the_file_gives_when_type_and_rope_type_disagree(tmp_path):
    from family_models import save_tiny

    path = save_tiny("phi3", tmp_path)
    _edited(path, rope_parameters={"rope_type": "default", "type": "su", "rope_theta": 1e4})
    with pytest.raises(ProbeError, match="type = 'su': it disagrees with rope_type 'default'"):
        import_model(path)
