"""`export_hf`: an imported (and possibly pruned) probe model back to a Hugging Face directory
that transformers loads with `from_pretrained`: config.json, the weights in the model's dtype
(model.safetensors, or shards and their index for a large model), tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.files import atomic_write_text
from probe.interop.families import family
from probe.interop.tokenizer import save_tokenizer
from probe.model import Transformer
from probe.runtime import dtype_name
from probe.weights import FILES, weights_dtype, write_weights

# what an export may write (the shards' names as a pattern), for `claim_output`
WRITES = ("config.json", *FILES, "tokenizer.json", "tokenizer_config.json")


def export_hf(
    model: Transformer,
    model_type: str,
    out: Path,
    tokenizer: Any | None = None,
    shard_bytes: int | None = None,
) -> list[Path]:
    """Write `model` as a Hugging Face checkpoint of family `model_type` into `out`, in the
    dtype its weights are held in, tensor by tensor (shards of at most `shard_bytes`, default
    `probe.weights.SHARD_BYTES`, when larger); returns the files written. A model the format
    cannot express is one clear ProbeError."""
    fam = family({"model_type": model_type}, "export")
    dtype = weights_dtype(model)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    hf_config, weights = fam.to_hf(state, model.cfg)
    hf_config = {**hf_config, "torch_dtype": dtype_name(dtype), "dtype": dtype_name(dtype)}
    if any(v.numel() == 0 for v in weights.values()):
        raise ProbeError("The model has a layer with no heads left; the format cannot hold it.")
    # tensors the family makes (zero biases) come in float32: written in the model's dtype
    weights = {k: v if v.dtype == dtype else v.to(dtype) for k, v in weights.items()}
    out.mkdir(parents=True, exist_ok=True)
    written = write_weights(out, weights, shard_bytes, metadata={"format": "pt"})
    written.insert(0, out / "config.json")
    atomic_write_text(written[0], json.dumps(hf_config, indent=2) + "\n")
    if tokenizer is not None:
        written.append(save_tokenizer(tokenizer, out / "tokenizer.json"))
        tok_config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        written.append(out / "tokenizer_config.json")
        atomic_write_text(written[-1], json.dumps(tok_config, indent=2) + "\n")
    return written
