"""Read a llama.cpp GGUF file of a Llama-family model as a Hugging Face checkpoint would hold it.

`read_gguf` reads the header (metadata, tensor names, types and shapes) and builds a
`LlamaConfig`-style config dict from the metadata; its `tensors` read one tensor at a time
under the Hugging Face `LlamaForCausalLM` name: F32, F16 and BF16 tensors as stored, quantized
ones dequantized to float32 with the `gguf` package. No transformers is needed.

Two layout differences between GGUF and Hugging Face are undone here:

1. Shape order. GGUF lists dimensions fastest-first (`[d_model, vocab]` for the embedding); the
   `gguf` reader already returns numpy arrays in row-major order (`[vocab, d_model]`), which is the
   torch / Hugging Face order. Every tensor's shape is checked against the config.

2. Rotary row order of q_proj and k_proj. Hugging Face's Llama rotates with `rotate_half`: inside a
   head of size d_head, row r < d_head/2 is paired with row r + d_head/2. llama.cpp rotates
   adjacent rows (2i, 2i+1), so its converter permutes the rows of each head:

       HF row (half, i)  ->  GGUF row (i, half)      half in {0, 1}, i in [0, d_head/2)

   i.e. it views a head's rows as [2, d_head/2], swaps the two axes, and flattens. The inverse
   views GGUF rows as [d_head/2, 2] and swaps back (`_unpermute_rotary`). k_proj is permuted per
   key/value head, so it is undone with n_kv_head heads.
"""

from __future__ import annotations

import contextlib
import mmap
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probe.errors import ProbeError
from probe.interop.fields import REQUIRED, Fields
from probe.weights import HeaderTensors

SUPPORTED_ARCHITECTURES = ("llama",)

# GGUF tensor name -> Hugging Face name, for tensors outside the blocks.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF name inside `blk.{i}.` -> Hugging Face name inside `model.layers.{i}.`
_BLOCK_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
# GGUF block tensors whose rows llama.cpp permutes for its rotary layout -> config key of the
# number of heads the permutation ran over.
_ROTARY_HEADS = {"attn_q.weight": "num_attention_heads", "attn_k.weight": "num_key_value_heads"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")
_HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")  # added by the reader


@dataclass(frozen=True)
class GGUFModel:
    config: dict[str, Any]  # Hugging Face LlamaConfig-style config.json dict
    tensors: GGUFTensors = field(repr=False)  # HF names -> tensors (read on demand), HF shapes
    metadata: dict[str, Any] = field(repr=False)  # raw GGUF key/value metadata, decoded


# GGUF tensor types stored as a torch dtype (read as they are); any other is quantized
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# integer types: named as such, so the importer refuses them as weights
_INTEGERS = {"I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}


class GGUFTensors(HeaderTensors):
    """A GGUF file's tensors under their Hugging Face names, each read when asked for (F32, F16
    and BF16 as stored, quantized types dequantized to float32), q/k rows put back in Hugging
    Face's rotary order. The file's pages read are handed back to the system after each tensor,
    so they never add up to a second copy of the model in the process's memory."""

    def __init__(self, reader: Any, config: dict[str, Any], path: Path) -> None:
        self.reader, self.path, self.config = reader, path, config
        self._tensors = {}  # HF name -> the reader's tensor
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}  # GGUF type names: F32, F16, Q4_1, ...
        shapes = _expected_shapes(config)
        for tensor in reader.tensors:
            hf_name = _hf_name(tensor.name, config["num_hidden_layers"], path)
            shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # row-major
            if shape != shapes[hf_name]:
                raise ProbeError(
                    f"GGUF file '{path}': tensor '{tensor.name}' has shape {shape}, "
                    f"expected {shapes[hf_name]} from the metadata"
                )
            self._tensors[hf_name] = tensor
            self.shapes[hf_name] = shape
            self.dtypes[hf_name] = tensor.tensor_type.name
        missing = [name for name in shapes if name not in self.shapes and name != "lm_head.weight"]
        if missing:
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise ProbeError(f"GGUF file '{path}' lacks {len(missing)} tensors: {shown}")

    def dtype(self, name: str) -> torch.dtype:
        """The dtype tensor `name` is read in (float32 for a quantized one)."""
        kind = self.dtypes[name]
        return _STORED.get(kind) or _INTEGERS.get(kind) or torch.float32

    def source_dtype(self) -> torch.dtype:
        """The dtype of the matrices when all share one of F32, F16, BF16; else (quantized or
        mixed) float32, what dequantizing gives."""
        kinds = {self.dtypes[n] for n, s in self.shapes.items() if len(s) == 2}
        return _STORED[kinds.pop()] if len(kinds) == 1 and kinds <= set(_STORED) else torch.float32

    def stored(self) -> str:
        """How the file stores its weights: 'float16', or the quantized types ('Q4_1, Q8_0')."""
        kinds = sorted({self.dtypes[n] for n, s in self.shapes.items() if len(s) == 2})
        if len(kinds) == 1 and kinds[0] in _STORED:
            return str(_STORED[kinds[0]]).removeprefix("torch.")
        return ", ".join(kinds)

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._tensors[name]
        weight = _read(tensor, self.path)
        if tuple(weight.shape) != self.shapes[name]:
            raise ProbeError(
                f"GGUF file '{self.path}': tensor '{tensor.name}' reads as shape "
                f"{tuple(weight.shape)}, expected {self.shapes[name]}"
            )
        _release(self.reader)
        block = _BLOCK_RE.fullmatch(tensor.name)
        heads_key = _ROTARY_HEADS.get(block[2]) if block else None
        if heads_key is not None:
            weight = _unpermute_rotary(weight, self.config[heads_key])
        return weight


def read_gguf(path: str | Path) -> GGUFModel:
    """Read a Llama GGUF file's metadata and tensor headers; its tensors are read on demand under
    their Hugging Face names."""
    path = Path(path)
    reader = _open_reader(path)
    metadata = metadata_of(reader, path)
    reader.fields.clear()  # decoded now; the reader's views of them take ~1 KB per token
    arch = metadata.get("general.architecture")
    if arch is None:
        raise ProbeError(f"GGUF file '{path}' has no 'general.architecture' metadata key")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise ProbeError(
            f"GGUF file '{path}': architecture '{arch}' is not supported; supported: {supported}"
        )
    gguf_names = [t.name for t in reader.tensors]
    config = _llama_config(metadata, gguf_names, path)
    tensors = GGUFTensors(reader, config, path)
    config["torch_dtype"] = str(tensors.source_dtype()).removeprefix("torch.")
    return GGUFModel(config=config, tensors=tensors, metadata=metadata)


def _open_reader(path: Path) -> Any:
    import gguf  # imported here so the rest of probe works without the optional package

    if not path.exists():
        raise ProbeError(f"GGUF file '{path}' does not exist")
    if not path.is_file():
        raise ProbeError(f"GGUF path '{path}' is not a file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ProbeError(f"cannot read GGUF file '{path}': {e.strerror or e}") from e
    if magic != b"GGUF":
        raise ProbeError(
            f"'{path}' is not a GGUF file: it does not start with the bytes 'GGUF' "
            "(expected a llama.cpp .gguf model file)"
        )
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises many kinds on bad input; all mean the same here
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProbeError(
            f"'{path}' is not a readable GGUF file: it looks truncated or corrupt "
            f"(gguf reader: {reason}); download or convert it again"
        ) from e


def metadata_of(reader: Any, path: Path) -> dict[str, Any]:
    """Every key/value pair of the file: strings decoded, arrays as python lists."""
    metadata: dict[str, Any] = {}
    for key, value_field in reader.fields.items():
        if key in _HEADER_FIELDS:
            continue
        try:
            metadata[key] = value_field.contents()
        except UnicodeDecodeError as e:
            raise ProbeError(f"GGUF file '{path}': metadata '{key}' is not valid UTF-8") from e
    return metadata


def _float32_value(value: float) -> float:
    """The shortest decimal that a float32 stores: 1e-5 comes back as 1e-05, not 9.9999997e-06."""
    return float(str(np.float32(value)))


# Metadata that llama.cpp reads for a Llama and that changes the function computed -> (the values
# that compute what probe computes, the feature): set otherwise, the file is refused.
_UNIMPLEMENTED = {
    "llama.rope.scaling.factor": ((0, 0.0, 1, 1.0), "rotary scaling (a scaling factor)"),
    "llama.rope.scale_linear": ((0, 0.0, 1, 1.0), "linear rotary scaling"),
    "llama.expert_count": ((0,), "mixture-of-experts layers"),
    "llama.expert_used_count": ((0,), "mixture-of-experts layers"),
}


def _llama_config(metadata: dict[str, Any], gguf_names: list[str], path: Path) -> dict[str, Any]:
    meta = Fields(metadata, f"GGUF file '{path}': metadata")

    def count(name: str, default: Any = REQUIRED, lo: int = 1) -> int:
        return meta.integer(f"llama.{name}", default, lo=lo)

    d_model = count("embedding_length")
    n_head = count("attention.head_count")
    n_kv_head = count("attention.head_count_kv", n_head)
    if meta.has("llama.attention.head_count_kv"):
        meta.divides("llama.attention.head_count", "llama.attention.head_count_kv")
    if not meta.has("llama.attention.key_length"):
        meta.divides("llama.embedding_length", "llama.attention.head_count")
    d_head = count("attention.key_length", d_model // n_head)
    d_value = count("attention.value_length", d_head)
    rotary_dims = count("rope.dimension_count", d_head)
    if d_value != d_head or rotary_dims != d_head or d_head % 2:
        raise ProbeError(
            f"GGUF file '{path}': unsupported attention layout (key length {d_head}, value "
            f"length {d_value}, rotary dims {rotary_dims}); probe imports heads whose keys, "
            "values and rotary dimensions have one even size"
        )
    scaling = meta.name("llama.rope.scaling.type", "none")
    if scaling != "none":
        meta.refuse("llama.rope.scaling.type", scaling, "rotary scaling is not implemented in "
                    "probe, which computes the plain rotary embedding.")  # fmt: skip
    for key, (neutral, feature) in _UNIMPLEMENTED.items():
        if meta.has(key) and meta.raw(key) not in neutral:
            meta.refuse(key, meta.raw(key), f"{feature} is not implemented in probe.")
    freq_base = meta.number("llama.rope.freq_base", 10000.0)
    if not freq_base > 1:
        meta.fail("llama.rope.freq_base", "a number greater than 1 (usually 10000)", freq_base)
    embed = "token_embd.weight"
    if embed not in gguf_names:
        raise ProbeError(f"GGUF file '{path}' lacks the tensor '{embed}'")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not meta.has("llama.vocab_size") and not (isinstance(tokens, list) and tokens):
        raise ProbeError(f"GGUF file '{path}' has neither 'llama.vocab_size' nor a token list")
    vocab_size = count("vocab_size", len(tokens) if isinstance(tokens, list) else None)
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": d_model,
        "intermediate_size": count("feed_forward_length"),
        "num_hidden_layers": count("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": d_head,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": _float32_value(meta.number("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_value(freq_base),
        "max_position_embeddings": count("context_length"),
        "tie_word_embeddings": "output.weight" not in gguf_names,
        "torch_dtype": "float32",
    }
    for token in ("bos", "eos", "pad"):
        gguf_key = f"tokenizer.ggml.{'padding' if token == 'pad' else token}_token_id"
        if meta.has(gguf_key):
            config[f"{token}_token_id"] = meta.integer(gguf_key, lo=0)
    return config


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape, for every tensor a Llama with this config holds."""
    d_model, d_ff = config["hidden_size"], config["intermediate_size"]
    d_q = config["num_attention_heads"] * config["head_dim"]
    d_kv = config["num_key_value_heads"] * config["head_dim"]
    block = {
        "self_attn.q_proj.weight": (d_q, d_model),
        "self_attn.k_proj.weight": (d_kv, d_model),
        "self_attn.v_proj.weight": (d_kv, d_model),
        "self_attn.o_proj.weight": (d_model, d_q),
        "mlp.gate_proj.weight": (d_ff, d_model),
        "mlp.up_proj.weight": (d_ff, d_model),
        "mlp.down_proj.weight": (d_model, d_ff),
        "input_layernorm.weight": (d_model,),
        "post_attention_layernorm.weight": (d_model,),
    }
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], d_model)}
    for layer in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{layer}.{name}": s for name, s in block.items()})
    shapes["model.norm.weight"] = (d_model,)
    shapes["lm_head.weight"] = (config["vocab_size"], d_model)
    return shapes


def _hf_name(gguf_name: str, n_layer: int, path: Path) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match and int(match[1]) < n_layer and match[2] in _BLOCK_NAMES:
        return f"model.layers.{int(match[1])}.{_BLOCK_NAMES[match[2]]}"
    raise ProbeError(
        f"GGUF file '{path}': tensor '{gguf_name}' has no place in a Hugging Face Llama "
        "(only plain Llama checkpoints are supported: no biases, experts or rope_freqs)"
    )


def _read(tensor: Any, path: Path) -> torch.Tensor:
    """One tensor in row-major order (reversed GGUF dims): F32, F16 and BF16 copied as stored,
    any other type dequantized to float32."""
    from gguf.quants import dequantize

    kind = tensor.tensor_type.name
    if kind in ("F32", "F16"):  # the reader's arrays are read-only views of the file: copy
        return torch.from_numpy(np.array(tensor.data, copy=True))
    if kind == "BF16":  # the reader gives the raw bytes, [rows, 2 * columns]
        raw = np.array(tensor.data, copy=True).view(np.uint16)
        return torch.from_numpy(raw).view(torch.bfloat16)
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ProbeError(
            f"GGUF file '{path}': tensor '{tensor.name}' uses {kind}, which the installed gguf "
            "package cannot dequantize"
        ) from e
    copy = not values.flags.writeable or values.dtype != np.float32
    return torch.from_numpy(np.array(values, dtype=np.float32, copy=copy))


def _release(reader: Any) -> None:
    """Hand the file's pages read so far back to the system: they stay in the page cache but
    stop counting as this process's memory (a no-op where the map or madvise is missing)."""
    mapped = getattr(getattr(reader, "data", None), "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mapped is not None and advice is not None:
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(advice)


def _unpermute_rotary(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: interleaved rotary pairs back to rotate_half halves."""
    rows, cols = weight.shape
    d_head = rows // n_head
    pairs = weight.reshape(n_head, d_head // 2, 2, cols)  # [head, pair i, half, d_model]
    return pairs.transpose(1, 2).reshape(rows, cols)  # [head * half * pair i, d_model]
