"""The safetensors weights of a model folder, one file or Hugging Face-style shards, read and
written one tensor at a time: memory holds the model once, never a second copy of it.

    model.safetensors                          one file, or
    model-00001-of-00003.safetensors ...       shards of at most `shard_bytes` each, and
    model.safetensors.index.json               {"metadata": {"total_size": N},
                                                "weight_map": {tensor name: shard file}}

Reading goes through `pread`, not a memory map, so the file's pages never count as the reading
process's memory; each file is written under a temporary name, synced and renamed into place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from probe.checkpoint_files import INDEX, SHARDS, WEIGHTS
from probe.errors import ProbeError
from probe.fields import shown
from probe.files import atomic_write, check_input_file

SHARD_BYTES = 2 * 10**9  # a model larger than this is written in shards of at most this size
FILES = (WEIGHTS, INDEX, SHARDS)  # what a folder's weights may be, as `claim_output` patterns

# safetensors' dtype names -> torch's (a name missing here is read as raw bytes and refused)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}  # fmt: skip


def read_json(file: Path, what: str) -> Any:
    """The parsed JSON of `file`, one clear line when it is not (`what` names the document)."""
    check_input_file(file, f"the {what} (a JSON file)")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{file} is not valid JSON ({exc}).") from None
    except RecursionError:
        raise ProbeError(
            f"{file} nests JSON arrays or objects too deeply to read; it is not a {what}."
        ) from None
    except OSError as exc:
        raise ProbeError(f"{file} cannot be read: {exc.strerror or exc}.") from None


def read_index(folder: Path) -> dict[str, Path]:
    """Tensor name -> shard file, as `model.safetensors.index.json` lists them; every shard it
    names must be present beside it."""
    index_file = folder / INDEX
    index = read_json(index_file, "shard index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ProbeError(
            f"{index_file}: weight_map must be a non-empty mapping from tensor names to shard "
            f"files, got {shown(weight_map)}."
        )
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise ProbeError(
                f"{index_file}: weight_map[{tensor!r:.60}] must be the name of a shard file "
                f"beside the index, got {shown(shard)}."
            )
    names = set(weight_map.values())
    missing = sorted(name for name in names if not (folder / name).exists())
    if missing:
        raise ProbeError(
            f"{index_file} names {len(names)} shards and {len(missing)} of them are missing "
            f"from '{folder}': {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}."
        )
    return {tensor: folder / shard for tensor, shard in weight_map.items()}


class HeaderTensors(Mapping):
    """Tensors named, shaped and typed by their files' headers (`shapes`), each read only when
    `self[name]` asks: membership, iteration and length read nothing."""

    shapes: dict[str, tuple[int, ...]]

    def __contains__(self, name: object) -> bool:
        return name in self.shapes  # (Mapping's own would read the tensor)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


class Weights(HeaderTensors):
    """The tensors of one safetensors file or of a shard index, read when asked for: names,
    shapes and dtypes come from the headers, each `weights[name]` reads that tensor alone."""

    def __init__(self, files: list[Path], advice: str, index: dict[str, Path] | None = None):
        self.advice = advice
        self._files: dict[str, Any] = {}  # tensor name -> open file
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}  # safetensors' names: BF16, F32, I64 ...
        for file in files:
            handle = open_safetensors(file, advice, backend="pread")
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                if name in self._files:
                    raise ProbeError(f"two shards hold the tensor '{name}'; {advice}")
                view = handle.get_slice(name)
                self._files[name] = handle
                self.shapes[name] = tuple(view.get_shape())
                self.dtypes[name] = view.get_dtype()
        for name, file in (index or {}).items():
            if name not in self._files:
                raise ProbeError(
                    f"{file.parent / INDEX} says '{file.name}' holds the tensor '{name}', which "
                    f"no shard holds; {advice}"
                )

    def dtype(self, name: str) -> torch.dtype | None:
        """The torch dtype tensor `name` is stored in (None: one torch cannot hold)."""
        return DTYPES.get(self.dtypes[name])

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._files:
            raise KeyError(name)
        try:
            return self._files[name].get_tensor(name)
        except Exception as exc:  # a file cut short after its header was read
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ProbeError(f"tensor '{name}' cannot be read ({reason}); {self.advice}") from None

    def source_dtype(self) -> torch.dtype:
        """The floating-point dtype that holds most of the weights (float32 when none does)."""
        sizes = ((self.dtype(n), torch.Size(s).numel()) for n, s in self.shapes.items())
        return majority_dtype(sizes)


def majority_dtype(sizes) -> torch.dtype:
    """Of (dtype, element count) pairs, the floating-point dtype with the most elements (the
    wider one on a tie; float32 when none is floating-point)."""
    counts: dict[torch.dtype, int] = {}
    for dtype, numel in sizes:
        if dtype is not None and dtype.is_floating_point and dtype != torch.float64:
            counts[dtype] = counts.get(dtype, 0) + numel
    if not counts:
        return torch.float32
    return max(counts, key=lambda d: (counts[d], d.itemsize))


def nonfinite(tensor: torch.Tensor, chunk: int = 1 << 24) -> int:
    """How many NaN or infinite values `tensor` holds, a chunk at a time (a mask of the whole
    of a large embedding would take a byte per value). A chunk whose float32 sum is finite
    holds none (a NaN or an infinity makes the sum NaN or infinite), so finite weights cost
    one summing pass; only a chunk whose sum is not (a NaN, or an overflow) is counted."""
    count = 0
    for part in tensor.reshape(-1).split(chunk):
        if not bool(torch.isfinite(torch.sum(part, dtype=torch.float32))):
            count += int((~torch.isfinite(part)).sum())
    return count


def open_weights(folder: Path, advice: str) -> Weights | None:
    """The weights of `folder`: model.safetensors when it is there, else the shards its index
    lists; None when it has neither."""
    single = folder / WEIGHTS
    if single.exists() or single.is_symlink():
        return Weights([single], advice)
    if (folder / INDEX).exists() or (folder / INDEX).is_symlink():
        index = read_index(folder)
        return Weights(sorted(set(index.values())), advice, index)
    return None


def _shard_plan(tensors: Mapping[str, torch.Tensor], shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped into shards of at most `shard_bytes` (a larger tensor alone), in
    order."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        if groups[-1] and size + tensor.nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += tensor.nbytes
    return groups


def write_weights(folder: Path, tensors: Mapping[str, torch.Tensor], shard_bytes: int | None = None,
                  metadata: dict[str, str] | None = None) -> list[Path]:  # fmt: skip
    """Write `tensors` into `folder`: one model.safetensors when they take at most `shard_bytes`
    (default SHARD_BYTES), else shards and their index. Weight files of the other layout left
    from before are removed. Returns the files written."""
    limit = SHARD_BYTES if shard_bytes is None else shard_bytes
    if limit < 1:
        raise ValueError(f"shard_bytes must be positive, got {limit}")
    folder.mkdir(parents=True, exist_ok=True)
    tensors = _unshared(tensors)
    groups = _shard_plan(tensors, limit)
    if len(groups) == 1:
        written = [folder / WEIGHTS]
        _write_file(written[0], tensors, metadata)
    else:
        written, weight_map = [], {}
        for k, names in enumerate(groups, 1):
            file = folder / f"model-{k:05d}-of-{len(groups):05d}.safetensors"
            _write_file(file, {name: tensors[name] for name in names}, metadata)
            weight_map |= dict.fromkeys(names, file.name)
            written.append(file)
        total = sum(t.nbytes for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        written.append(folder / INDEX)
        atomic_write(written[-1], lambda tmp: tmp.write_text(json.dumps(index, indent=2) + "\n"))
    for stale in weight_files(folder):
        if stale not in written:
            stale.unlink(missing_ok=True)
    return written


def weight_files(folder: Path) -> list[Path]:
    """The weight files in `folder`, of either layout."""
    shard = re.compile(r"model-\d+-of-\d+\.safetensors")
    found = [folder / n for n in (WEIGHTS, INDEX) if (folder / n).exists()]
    return found + sorted(p for p in folder.glob(SHARDS) if shard.fullmatch(p.name))


def _unshared(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` on the CPU and contiguous (as safetensors writes them), each in its own storage:
    a tensor that shares another's storage (a tied embedding written under two names) is
    copied, the only copy made."""
    seen, out = set(), {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        key = tensor.untyped_storage().data_ptr()
        if tensor.numel() and key in seen:
            tensor = tensor.clone()
        seen.add(key)
        out[name] = tensor
    return out


def _write_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict | None) -> None:
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def weights_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model's weights are held in (its first floating-point parameter's)."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def load_safetensors(file: str | Path, advice: str) -> dict:
    """Every tensor of a safetensors file; a file that is not one (empty, cut short, a header
    whose sizes or offsets lie) is one line naming it, what is wrong in the header's words,
    and `advice` ("download it again")."""
    handle = open_safetensors(file, advice)
    with _readable(file, advice):
        return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118


def open_safetensors(file: str | Path, advice: str, backend: str | None = None):
    """A safetensors file opened for reading one tensor at a time (`keys()`, `get_slice(name)`,
    `get_tensor(name)`); a file that is not one is one line, as for `load_safetensors`.
    `backend="pread"` reads with pread(2) instead of a memory map (whose pages would count as
    the process's memory), where the installed safetensors offers it."""
    check_input_file(file, "a safetensors weights file")
    with _readable(file, advice):
        if backend is not None:
            try:
                return safe_open(str(file), framework="pt", device="cpu", backend=backend)
            except TypeError:  # safetensors before 0.7 memory-maps only
                pass
        return safe_open(str(file), framework="pt", device="cpu")


@contextmanager
def _readable(file: str | Path, advice: str) -> Iterator[None]:
    """safetensors' errors as one line naming the file and the header's complaint."""
    try:
        yield
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = reason.removeprefix("Error while deserializing header: ")
        raise ProbeError(
            f"{file} is not a readable safetensors file ({reason}): it is truncated or "
            f"corrupt; {advice}"
        ) from None
