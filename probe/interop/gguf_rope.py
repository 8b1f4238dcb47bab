"""Rotary scaling in GGUF files, read and written as llama.cpp's converter
(`convert_hf_to_gguf.py`, now `conversion/base.py` and `conversion/llama.py`, `phi.py`) writes it
and llama.cpp (`src/llama-model.cpp`, ggml's rope) computes it.

What the converter writes, per Hugging Face kind:

- linear: `{arch}.rope.scaling.type = "linear"` and `{arch}.rope.scaling.factor`
  (TextModel.set_gguf_parameters). llama.cpp divides every frequency by the factor; a factor
  without a type is linear too (the loader's default type), `rope.scale_linear` an old name.
- yarn: type "yarn", factor, `rope.scaling.original_context_length`, and when the section has
  them `rope.scaling.yarn_beta_fast`, `yarn_beta_slow`, `yarn_attn_factor` (its
  attention_factor) and `yarn_ext_factor` (a non-transformers extrapolation_factor).
- llama3 (LlamaModel.generate_extra_tensors): no metadata; the tensor `rope_freqs.weight`
  [dims/2] float32 of per-pair divisors: 1 for wavelengths below L / high_freq_factor, the factor
  above L / low_freq_factor, 1 / ((1 - smooth) / factor + smooth) between. llama.cpp turns pair i
  by base^(-2i/d) / rope_freqs[i] (ggml_rope_ext's freq_factors). The file keeps no parameters:
  `llama3_section` finds the ones real checkpoints use that rebuild the tensor.
- longrope, Phi-3 (Phi3MiniModel): `phi3.rope.scaling.original_context_length` (always),
  `phi3.rope.scaling.attn_factor` (sqrt(1 + ln s / ln L), s = context / L) and the tensors
  `rope_factors_long.weight` / `rope_factors_short.weight` (the section's lists, float32); no
  scaling type.

Anything else (dynamic, DeepSeek's yarn_log_multiplier, an attention factor on another
architecture) is refused in one line naming the key or tensor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from probe.errors import ProbeError
from probe.rope import RopeScaling

if TYPE_CHECKING:
    from probe.interop.gguf_meta import Meta

ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# (low_freq_factor, high_freq_factor) Llama 3.1 / 3.2 / 3.3 ship, and their original contexts
LLAMA3_BANDS = ((1.0, 4.0),)
LLAMA3_ORIGINALS = (8192, *(2**k for k in range(4, 22) if 2**k != 8192))
# float32 tensors hold the converter's values to the last bit; narrower types round them
_TOLERANCE = {"F32": 1e-6, "F16": 1e-3, "BF16": 8e-3}


def _float32(value: float) -> float:
    """The shortest decimal a float32 stores (metadata floats are float32)."""
    return float(str(np.float32(value)))


def read_section(meta: Meta, context: int, longrope: bool = False) -> dict[str, Any]:
    """The Hugging Face section keys (rope_type and the kind's parameters) the metadata asks for:
    {} for the plain rotary, linear or yarn as llama.cpp reads them; `longrope`: the file's
    architecture takes Phi-3's attention factor (read by `longrope_section`)."""
    fields = meta.fields
    kind = fields.name(meta.key("rope.scaling.type"), None)
    factor_key = "rope.scaling.factor" if meta.has("rope.scaling.factor") else "rope.scale_linear"
    factor = meta.number(factor_key, 0.0, positive=False) if meta.has(factor_key) else 0.0
    if not (isinstance(factor, float | int) and math.isfinite(factor) and factor >= 0):
        fields.fail(meta.key(factor_key), "a number >= 0 (0 or 1: no scaling)", factor)
    if not longrope and meta.number("rope.scaling.attn_factor", 1.0) != 1.0:
        meta.refuse("rope.scaling.attn_factor", "an attention factor on the rotary is read for "
                    "Phi-3 (longrope) only.")  # fmt: skip
    if meta.number("rope.scaling.yarn_log_multiplier", 0.0, positive=False) != 0.0:
        meta.refuse("rope.scaling.yarn_log_multiplier", "YaRN with DeepSeek's mscale_all_dim "
                    "is not implemented for this architecture in probe.")  # fmt: skip
    if kind is None:  # llama.cpp's loader: a factor without a type is linear
        kind = "linear" if factor not in (0.0, 1.0) else "none"
    if kind == "none":
        return {}
    if kind not in ("linear", "yarn"):
        meta.refuse("rope.scaling.type", "probe reads rotary scaling 'linear' and 'yarn' from "
                    "metadata ('none': plain), llama3 from rope_freqs.weight and Phi-3's "
                    "longrope from its factor tensors.")  # fmt: skip
    if factor == 0.0:
        meta.refuse("rope.scaling.type", f"rotary scaling '{kind}' needs "
                    f"{meta.key('rope.scaling.factor')}, which the file lacks.")  # fmt: skip
    if kind == "linear":
        return {"rope_type": "linear", "factor": _float32(factor)}
    section = {"rope_type": "yarn", "factor": _float32(factor),
               "original_max_position_embeddings":
                   meta.count("rope.scaling.original_context_length", context)}  # fmt: skip
    extrapolation = meta.number("rope.scaling.yarn_ext_factor", 1.0, positive=False)
    if extrapolation != 1.0:
        meta.refuse("rope.scaling.yarn_ext_factor", "transformers' YaRN extrapolates fully "
                    "(1.0); probe computes it so.")  # fmt: skip
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                      ("yarn_attn_factor", "attention_factor")):  # fmt: skip
        if meta.has(f"rope.scaling.{key}"):
            section[name] = _float32(meta.number(f"rope.scaling.{key}"))
    return section


def llama3_freqs(base: float, dims: int, scaling: RopeScaling) -> np.ndarray:
    """`rope_freqs.weight` [dims/2] float32 of a llama3 scaling, as LlamaModel.
    generate_extra_tensors computes it: float32 frequencies, wavelengths compared with
    L / high_freq_factor and L / low_freq_factor, the smooth band's divisor
    1 / ((1 - smooth) / factor + smooth)."""
    import torch

    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_position_embeddings
    freqs = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims))  # [pairs]
    wavelength = 2 * math.pi / freqs  # [pairs]
    smooth = (original / wavelength - low) / (high - low)  # [pairs]
    between = 1 / ((1 - smooth) / factor + smooth)  # [pairs]
    divisors = torch.where(wavelength > original / low, torch.tensor(float(factor)), between)
    divisors = torch.where(wavelength < original / high, torch.tensor(1.0), divisors)  # [pairs]
    return divisors.to(torch.float32).numpy()


def _llama3_rebuilt(
    base: float, dims: int, freqs: np.ndarray, tolerance: float
) -> RopeScaling | None:
    """The llama3 scaling whose `llama3_freqs` equal `freqs` within `tolerance`: factor = the
    largest divisor, (low, high) and the original context among those real checkpoints use;
    None if none does."""
    factor = _float32(float(freqs.max()))
    for low, high in LLAMA3_BANDS:
        for original in LLAMA3_ORIGINALS:
            scaling = RopeScaling("llama3", factor=factor, low_freq_factor=low,
                                  high_freq_factor=high,
                                  original_max_position_embeddings=original)  # fmt: skip
            if np.allclose(llama3_freqs(base, dims, scaling), freqs, rtol=tolerance, atol=0):
                return scaling
    return None


def llama3_section(meta: Meta, name: str, dims: int, base: float) -> dict[str, Any]:
    """The llama3 section whose `llama3_freqs` equals the file's `rope_freqs.weight` within its
    type's rounding: factor = its largest divisor, (low, high) and the original context tried
    among those real checkpoints use; {} when every divisor is 1. Refused in one line if none
    fits."""
    freqs, kind = meta.tensor(name)
    if freqs.shape != (dims // 2,) or not np.isfinite(freqs).all() or not (freqs > 0).all():
        raise ProbeError(f"GGUF file '{meta.path}': tensor '{name}' must hold {dims // 2} "
                         f"positive divisors, one per rotated pair (llama3 rotary scaling), "
                         f"got shape {freqs.shape}")  # fmt: skip
    factor = _float32(float(freqs.max()))
    if factor == 1.0 and (freqs == 1.0).all():
        return {}
    scaling = _llama3_rebuilt(base, dims, freqs, _TOLERANCE.get(kind, 1e-6))
    if scaling is not None:
        return {"rope_type": "llama3", **{k: v for k, v in scaling.to_dict().items()
                                          if k != "kind"}}  # fmt: skip
    raise ProbeError(
        f"GGUF file '{meta.path}': tensor '{name}' holds per-pair rotary divisors that no Llama 3 "
        f"scaling rebuilds (factor {factor}, low/high_freq_factor 1/4, original context 8192 or a "
        "power of two); probe reads rope_freqs.weight as llama3 scaling only"
    )


def longrope_section(meta: Meta, dims: int, context: int, original: int) -> dict[str, Any]:
    """Phi-3's longrope section from `rope_factors_long/short.weight` and the metadata's
    attention factor ({} when the file has neither tensor); the attention factor is kept only
    where it is not the one transformers computes from the contexts."""
    has = [n in meta.shapes for n in ("rope_factors_long.weight", "rope_factors_short.weight")]
    if not any(has):
        if meta.has("rope.scaling.attn_factor") and meta.number("rope.scaling.attn_factor") != 1:
            meta.refuse("rope.scaling.attn_factor", "an attention factor without rope_factors"
                        "_long/short.weight scales nothing probe computes.")  # fmt: skip
        return {}
    if not all(has):
        missing = "rope_factors_short.weight" if has[0] else "rope_factors_long.weight"
        raise ProbeError(f"GGUF file '{meta.path}' lacks the tensor '{missing}' (longrope needs "
                         "both rope_factors_long and rope_factors_short)")  # fmt: skip
    section: dict[str, Any] = {"rope_type": "longrope"}
    for which in ("long", "short"):
        name = f"rope_factors_{which}.weight"
        values, _ = meta.tensor(name)
        if values.shape != (dims // 2,) or not np.isfinite(values).all() or (values <= 0).any():
            raise ProbeError(f"GGUF file '{meta.path}': tensor '{name}' must hold {dims // 2} "
                             f"positive factors, one per rotated pair, got shape "
                             f"{values.shape}")  # fmt: skip
        section[f"{which}_factor"] = [_float32(v) for v in values.tolist()]
    scale = context / original
    computed = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    given = meta.number("rope.scaling.attn_factor", computed)
    if not math.isclose(given, computed, rel_tol=1e-6):
        section["attention_factor"] = _float32(given)
    return section


def check_exportable(scaling: RopeScaling, base: float, dims: int) -> None:
    """Refuse, in one line, a scaling llama.cpp's llama architecture cannot compute as probe,
    or a llama3 scaling whose `rope_freqs.weight` no reader could turn back into its section
    (probe's import included)."""
    if scaling.kind == "llama3":
        freqs = llama3_freqs(base, dims, scaling)
        if (freqs != 1.0).any() and _llama3_rebuilt(base, dims, freqs, 1e-6) is None:
            raise ProbeError(
                "GGUF carries llama3 scaling only as rope_freqs.weight, which reads back as a "
                "llama3 section only for the factors real checkpoints use (factor >= 1, "
                "low/high_freq_factor 1/4, an original context of 8192 or a power of two); "
                f"this model's ({scaling.describe()}) would not. Use --format hf."
            )
        return
    if scaling.kind in ("default", "linear"):
        return
    if scaling.kind == "yarn":
        extra = [n for n in ("attention_factor", "mscale", "mscale_all_dim")
                 if getattr(scaling, n) is not None]  # fmt: skip
        if extra or scaling.truncate is False:
            what = ", ".join(extra) or "truncate false"
            raise ProbeError(f"GGUF export writes YaRN with its factor, original context and "
                             f"betas; this model's YaRN sets {what}, which llama.cpp's llama "
                             "architecture computes otherwise. Use --format hf.")  # fmt: skip
        return
    raise ProbeError(f"GGUF export writes rotary scaling linear, yarn or llama3; llama.cpp's "
                     f"llama architecture cannot compute this model's '{scaling.kind}'. Use "
                     "--format hf.")  # fmt: skip


def add_scaling(writer: Any, base: float, dims: int, scaling: RopeScaling) -> dict[str, Any]:
    """Write the metadata of `scaling` as the converter does; the extra tensors it writes
    (llama3: rope_freqs.weight) are returned by GGUF name."""
    import gguf

    if scaling.kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling.factor)
    elif scaling.kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling.resolved_factor())
        writer.add_rope_scaling_orig_ctx_len(scaling.original_max_position_embeddings)
        if scaling.beta_fast is not None:
            writer.add_rope_scaling_yarn_beta_fast(scaling.beta_fast)
        if scaling.beta_slow is not None:
            writer.add_rope_scaling_yarn_beta_slow(scaling.beta_slow)
    elif scaling.kind == "llama3":
        return {"rope_freqs.weight": llama3_freqs(base, dims, scaling)}
    return {}
