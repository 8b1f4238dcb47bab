"""Set a model's rotary scaling after the fact: the same weights, other rotary frequencies (a
scaling the model was not trained with, as a training-free experiment)."""

from __future__ import annotations

from probe.model.positional import Rotary
from probe.model.transformer import Transformer
from probe.rope import RopeScaling
from probe.rope_experiment import replaced


def with_rope_scaling(model: Transformer, scaling: RopeScaling) -> Transformer:
    """`model` with the rotary of its global (full-attention) layers scaled by `scaling`, in
    place: its config becomes `cfg` with `rope_scaling=scaling`, and every attention's rotary
    is rebuilt from that config (`cfg.rotary(layer)`: the sliding-window layers of Gemma 3 and
    OLMo-3 keep their own rotary, the layers without rotary stay without) on the device it was
    on. No weight changes. A model without rotary is refused in one line (ProbeError)."""
    cfg = replaced(model.cfg, scaling)
    for attn in model.attention_modules():
        if attn.rotary is None:
            continue
        device = attn.rotary.inv_freq.device
        attn.rotary = Rotary(cfg, *cfg.rotary(attn.site.index)).to(device)
    model.cfg = cfg
    return model
