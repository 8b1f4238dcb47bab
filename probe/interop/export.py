"""`export_hf`: an imported (and possibly pruned) probe model back to a Hugging Face directory
that transformers loads with `from_pretrained`: config.json, model.safetensors, tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.interop.families import family
from probe.model import Transformer


def export_hf(
    model: Transformer, model_type: str, out: Path, tokenizer: Any | None = None
) -> list[Path]:
    """Write `model` as a Hugging Face checkpoint of family `model_type` into `out`; returns the
    files written. A model the format cannot express is one clear ProbeError."""
    from safetensors.torch import save

    from probe.files import atomic_write_bytes, atomic_write_text

    fam = family({"model_type": model_type}, "export")
    state = {k: v.detach().cpu().float().contiguous() for k, v in model.state_dict().items()}
    hf_config, weights = fam.to_hf(state, model.cfg)
    hf_config = {**hf_config, "torch_dtype": "float32", "dtype": "float32"}
    weights = {k: v.clone().contiguous() for k, v in weights.items()}  # no shared storage
    if any(v.numel() == 0 for v in weights.values()):
        raise ProbeError("The model has a layer with no heads left; the format cannot hold it.")
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "config.json", out / "model.safetensors"]
    atomic_write_bytes(written[1], save(weights, metadata={"format": "pt"}))
    atomic_write_text(written[0], json.dumps(hf_config, indent=2) + "\n")
    if tokenizer is not None:
        from probe.interop.tokenizer import save_tokenizer

        written.append(save_tokenizer(tokenizer, out / "tokenizer.json"))
        tok_config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        written.append(out / "tokenizer_config.json")
        atomic_write_text(written[-1], json.dumps(tok_config, indent=2) + "\n")
    return written
