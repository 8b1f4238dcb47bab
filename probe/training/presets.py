"""Named bundles of settings, applied under the ones given explicitly.

    probe train --preset paper ...          [base] preset = "paper"   (study files)

`paper` is the base model of "Attention Is All You Need" (Vaswani et al. 2017) at whatever size
is asked for: post-LN residual sub-layers (section 3.1), token embeddings multiplied by
sqrt(d_model) and shared with the output projection (3.4), the sinusoidal table (3.5), a ReLU FFN
of width 4 d_model (3.3: 2048 = 4 x 512), dropout 0.1 (5.4), Adam with beta1 0.9, beta2 0.98,
eps 1e-9 and no weight decay, the warm-up schedule of section 5.3 with 4000 warm-up steps, no
gradient clipping, and label smoothing 0.1 (5.4). The defaults of `probe train` differ: pre-LN,
unscaled embeddings, a learned table, AdamW with cosine decay and clipping.
"""

from __future__ import annotations

from typing import Any

from probe.errors import ProbeError
from probe.words import did_you_mean

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {
        "model": {
            "norm": "post", "embed_scale": True, "tie_embeddings": True, "pe": "sinusoidal",
            "ffn": "relu", "ffn_mult": 4.0, "dropout": 0.1, "scale": "sqrt",
        },
        "train": {
            "schedule": "paper", "lr": 1.0, "warmup": 4000, "weight_decay": 0.0,
            "adam_eps": 1e-9, "grad_clip": 0.0, "label_smoothing": 0.1,
        },
    },
}  # fmt: skip


def preset(name: str) -> dict[str, dict[str, Any]]:
    """The settings of preset `name` per config section ("model", "train")."""
    if name not in PRESETS:
        raise ProbeError(
            f"Unknown preset '{name}'.{did_you_mean(name, list(PRESETS))} "
            f"Available: {', '.join(PRESETS)}."
        )
    return {section: dict(values) for section, values in PRESETS[name].items()}


def with_preset(name: str | None, settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`settings` (section -> field -> value) laid over preset `name` (None: unchanged)."""
    if name is None:
        return settings
    merged = preset(name)
    for section, values in settings.items():
        merged[section] = {**merged.get(section, {}), **values}
    return merged
