"""Read a llama.cpp GGUF file as the Hugging Face checkpoint it was converted from.

`read_gguf` reads the header (metadata, tensor names, types and shapes) and, by the file's
`general.architecture`, builds that family's Hugging Face config.json dict from the metadata; its
`tensors` read one tensor at a time under the Hugging Face name: F32, F16 and BF16 tensors as
stored, quantized ones dequantized to float32 with the `gguf` package. No transformers is needed.
What each architecture's names, shapes and layout fix-ups are lives in `gguf_archs` (one table per
architecture) and `gguf_configs` (one metadata -> config function per architecture).

Shape order: GGUF lists dimensions fastest-first (`[d_model, vocab]` for the embedding); the
`gguf` reader already returns numpy arrays in row-major order (`[vocab, d_model]`), which is the
torch / Hugging Face order. Every tensor's shape is checked against the config.

Rotary row order of a Llama's q_proj and k_proj: Hugging Face rotates with `rotate_half`: inside a
head of size d_head, row r < d_head/2 is paired with row r + d_head/2. llama.cpp rotates adjacent
rows (2i, 2i+1) for the Llama architecture, so its converter permutes the rows of each head:

    HF row (half, i)  ->  GGUF row (i, half)      half in {0, 1}, i in [0, d_head/2)

i.e. it views a head's rows as [2, d_head/2], swaps the two axes, and flattens. The inverse views
GGUF rows as [d_head/2, 2] and swaps back (`gguf_archs.unpermute_rotary`); k_proj is permuted per
key/value head, so it is undone with n_kv_head heads. The other architectures rotate as Hugging
Face does (llama.cpp's NEOX rotary) and are stored unpermuted.
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

from probe.errors import ProbeError, optional
from probe.interop.gguf_archs import ARCHS, GGUFArch, expected_shapes
from probe.interop.gguf_meta import Meta
from probe.interop.gguf_rope import ROPE_TENSORS
from probe.weights import HeaderTensors

SUPPORTED_ARCHITECTURES = tuple(ARCHS)  # llama first
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")
_HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")  # added by the reader


@dataclass(frozen=True)
class GGUFModel:
    config: dict[str, Any]  # Hugging Face LlamaConfig-style config.json dict
    tensors: GGUFTensors = field(repr=False)  # HF names -> tensors (read on demand), HF shapes
    metadata: dict[str, Any] = field(repr=False)  # raw GGUF key/value metadata, decoded
    label: str = "Llama"  # the Hugging Face family the file was read as, in messages


# GGUF tensor types stored as a torch dtype (read as they are); any other is quantized
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# integer types: named as such, so the importer refuses them as weights
_INTEGERS = {"I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}


class GGUFTensors(HeaderTensors):
    """A GGUF file's tensors under their Hugging Face names, each read when asked for (F32, F16
    and BF16 as stored, quantized types dequantized to float32), q/k rows put back in Hugging
    Face's rotary order. The file's pages read are handed back to the system after each tensor,
    so they never add up to a second copy of the model in the process's memory."""

    def __init__(self, reader: Any, config: dict[str, Any], path: Path,
                 arch: GGUFArch = ARCHS["llama"],
                 used: frozenset[str] = frozenset()) -> None:  # fmt: skip
        self.reader, self.path, self.config, self.arch = reader, path, config, arch
        self._tensors = {}  # HF name -> the reader's tensor
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}  # GGUF type names: F32, F16, Q4_1, ...
        shapes = expected_shapes(arch, config)
        for tensor in reader.tensors:
            if tensor.name in used:  # read into the config (rotary scaling), not a weight
                continue
            hf_name = _hf_name(arch, tensor.name, config["num_hidden_layers"], path)
            shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # row-major
            if shape != shapes[hf_name]:
                raise ProbeError(
                    f"GGUF file '{path}': tensor '{tensor.name}' has shape {shape}, "
                    f"expected {shapes[hf_name]} from the metadata"
                )
            self._tensors[hf_name] = tensor
            self.shapes[hf_name] = shape
            self.dtypes[hf_name] = tensor.tensor_type.name
        missing = [name for name in shapes if name not in self.shapes and not _optional(arch, name)]
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
        fix = self.arch.fixes.get(block[2] if block else tensor.name)
        return weight if fix is None else fix(weight, self.config)


def read_gguf(path: str | Path) -> GGUFModel:
    """Read a GGUF file's metadata and tensor headers (one of `SUPPORTED_ARCHITECTURES`); its
    tensors are read on demand under their Hugging Face names."""
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
    spec = ARCHS[arch]
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    by_name = {t.name: t for t in reader.tensors}
    meta = Meta(metadata, shapes, arch, path, lambda name: _small(by_name[name], path))
    config = spec.config(meta)
    tensors = GGUFTensors(reader, config, path, spec, frozenset(meta.used))
    config["torch_dtype"] = str(tensors.source_dtype()).removeprefix("torch.")
    return GGUFModel(config=config, tensors=tensors, metadata=metadata, label=spec.label)


def _open_reader(path: Path) -> Any:
    if not path.exists():
        raise ProbeError(f"GGUF file '{path}' does not exist")
    if not path.is_file():
        raise ProbeError(f"GGUF path '{path}' is not a file")
    gguf = optional("gguf", "Reading a GGUF file")
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


def _small(tensor: Any, path: Path) -> tuple[np.ndarray, str]:
    """A small tensor the config is built from (rotary scaling) as float32 numpy values, and
    its GGUF type name."""
    return _read(tensor, path).float().numpy(), tensor.tensor_type.name


def _optional(arch: GGUFArch, hf_name: str) -> bool:
    """A tensor the file may lack (an untied output, GPT-NeoX's attention biases)."""
    return any(hf_name.endswith(arch.globals.get(n, arch.blocks.get(n, ("-",)))[0])
               for n in arch.optional)  # fmt: skip


def _hf_name(arch: GGUFArch, gguf_name: str, n_layer: int, path: Path) -> str:
    if gguf_name in arch.globals:
        return arch.globals[gguf_name][0]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match and int(match[1]) < n_layer and match[2] in arch.blocks:
        return f"{arch.layer_prefix}{int(match[1])}.{arch.blocks[match[2]][0]}"
    if gguf_name in ROPE_TENSORS:
        raise ProbeError(
            f"GGUF file '{path}': tensor '{gguf_name}' holds rotary scaling factors, which "
            f"probe reads for llama (rope_freqs, llama3 scaling) and phi3 (rope_factors_long and "
            f"_short, longrope), not for {arch.label}"
        )
    raise ProbeError(
        f"GGUF file '{path}': tensor '{gguf_name}' has no place in a Hugging Face {arch.label} "
        f"({arch.hint})"
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
