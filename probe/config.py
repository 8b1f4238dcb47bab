"""Frozen, validated configuration objects: the model's (`ModelConfig`; the training run's,
`TrainConfig`, is in `probe.train_config`).

Every choice that has more than two values is a `StrEnum`; every config has `from_dict`, which
rejects unknown keys with a did-you-mean message and values of the wrong type by field name, and
`to_dict`, which is JSON-ready (the helpers are in `probe.fields`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from probe.errors import ProbeError
from probe.fields import (  # re-exported: their old home
    choice,
    field_value,
    from_dict,
    to_dict,
)
from probe.rope import UNSCALED, RopeScaling
from probe.site import Site

# the longest sliding window: transformers computes with int64 positions (a window of
# 10**30 overflows there), and 2**40 tokens is past any context
MAX_WINDOW = 2**40


class Arch(StrEnum):
    DECODER = "decoder"  # causal language model (GPT)
    ENCODER = "encoder"  # bidirectional (BERT)
    ENCODER_DECODER = "encoder-decoder"  # the paper's translation model, with cross-attention


class PE(StrEnum):
    """Positional encodings, grouped by where they act."""

    SINUSOIDAL = "sinusoidal"  # on the input, the paper's table
    LEARNED = "learned"  # on the input, a trained table of max_len rows
    NONE = "none"  # no positional signal (causal masking still leaks order)
    ROPE = "rope"  # on q and k: rotary (Su et al. 2021)
    ALIBI = "alibi"  # on the scores: linear distance penalty (Press et al. 2021)
    T5 = "t5"  # on the scores: learned bucketed relative bias (Raffel et al. 2020)
    FIRE = "fire"  # on the scores: learned function of log-distance, normalized (Li et al. 2023)


class Scale(StrEnum):
    """The factor on q.k before the softmax."""

    SQRT = "sqrt"  # 1/sqrt(d_head), the paper
    INVERSE = "inverse"  # 1/d_head (muP)
    NONE = "none"  # 1: unscaled
    LEARNED = "learned"  # a learned per-head temperature, initialised at 1/sqrt(d_head)


class Norm(StrEnum):
    """Where each residual sub-layer's norms sit (every placement but post adds a final norm)."""

    POST = "post"  # x = LN(x + sublayer(x)), the paper
    PRE = "pre"  # x = x + sublayer(LN(x)), GPT-2 and later
    SANDWICH = "sandwich"  # x = x + LN'(sublayer(LN(x))): before and after (Gemma 2 and 3)
    BRANCH = "branch"  # x = x + LN(sublayer(x)): on the branch's output only (OLMo-2)


class NormType(StrEnum):
    LAYER = "layer"  # LayerNorm: centre, scale, gain and bias (the paper, BERT, GPT-2)
    RMS = "rms"  # RMSNorm: scale by the root mean square, gain only (Llama)


class FFN(StrEnum):
    RELU = "relu"  # the paper
    GELU = "gelu"  # BERT (exact erf form)
    GELU_TANH = "gelu-tanh"  # GPT-2 (tanh approximation)
    SWIGLU = "swiglu"  # down(silu(gate(x)) * up(x)) (Shazeer 2020; Llama)
    GEGLU = "geglu"  # down(gelu_tanh(gate(x)) * up(x)) (Shazeer 2020; Gemma)
    NONE = "none"  # attention-only blocks


@dataclass(frozen=True)
class ModelConfig:
    # fields added after the first cached study cells: a cell's key leaves them out while they
    # are at their default (the behaviour those cells ran with); a new field goes here too
    ADDED_LATER: ClassVar[tuple[str, ...]] = (
        "n_kv_head", "norm_type", "qkv_bias", "type_vocab_size", "embed_norm", "head_transform",
        "head_bias", "sliding_window", "window_layers", "norm_offset", "norm_gain_float32",
        "parallel_residual", "rope_local_base", "qk_norm_whole", "scale_dim", "attn_softcap",
        "final_softcap", "rope_float32", "rope_scaling", "rope_local_scaling", "nope_layers",
    )  # fmt: skip
    arch: Arch = Arch.DECODER
    vocab_size: int = 32  # tokens, special tokens included
    n_layer: int = 2  # blocks (encoder blocks for encoder-decoder)
    n_dec_layer: int | None = None  # decoder blocks of an encoder-decoder (default n_layer)
    n_head: int = 4  # query heads per attention sub-layer before any pruning
    n_kv_head: int | None = None  # key/value heads per sub-layer (None: n_head; fewer: GQA)
    d_model: int = 64  # residual stream width
    d_head: int | None = None  # per-head width of q, k, v (default d_model // n_head)
    ffn: FFN = FFN.RELU  # FFN activation, or none for attention-only blocks
    ffn_mult: float = 4.0  # FFN width as a multiple of d_model (the paper: 2048/512 = 4)
    norm: Norm = Norm.PRE
    norm_type: NormType = NormType.LAYER
    norm_offset: float = 0.0  # RMSNorm's gain is (norm_offset + weight) (Gemma: 1)
    # RMSNorm multiplies by its gain in float32 and rounds once (Gemma, OLMo-2), rather than
    # rounding the normalised x to the weights' dtype first (Llama); the same in float32
    norm_gain_float32: bool = False
    parallel_residual: bool = False  # x + attn(LN1(x)) + ffn(LN2(x)) (GPT-J, GPT-NeoX); pre only
    pe: PE = PE.LEARNED
    max_len: int = 256  # positions a learned table holds; range for randomized positions
    rope_fraction: float = 1.0  # fraction of each head's dimensions that rotary rotates
    rope_base: float = 10000.0
    # the rotary scaling of the layers of rope_base: a kind of probe.rope.KINDS (transformers'
    # rope_type: linear, dynamic, yarn, llama3, longrope; and ntk) with its parameters
    rope_scaling: RopeScaling = UNSCALED
    # the sliding-window layers' own rotary base and scaling (Gemma 3, OLMo-3: one rotary per
    # layer type; None: those layers rotate as the others)
    rope_local_base: float | None = None
    rope_local_scaling: RopeScaling = UNSCALED
    nope_layers: tuple[int, ...] | None = None  # layers (0-based) without rotary (SmolLM3)
    # rotary rotates q and k in float32 and rounds once (OLMo-2), rather than in their dtype with
    # cos and sin rounded to it (Llama, GPT-NeoX); the same in float32
    rope_float32: bool = False
    t5_buckets: int = 32  # relative-position buckets of the T5 bias
    t5_max_distance: int = 128  # distance where the T5 buckets stop growing
    scale: Scale = Scale.SQRT
    qk_norm: bool = False  # the model's norm on q and k of each head (Wortsman et al. 2023)
    qk_norm_whole: bool = False  # the qk norm over all heads' q (and k) at once (OLMo-2)
    scale_dim: float | None = None  # with scale sqrt: 1/sqrt(scale_dim), not 1/sqrt(d_head)
    attn_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    final_softcap: float | None = None  # the same on the output logits (Gemma 2)
    log_scale_len: int | None = None  # L_train: multiply q.k by log(n)/log(L_train) when set
    embed_scale: bool = False  # multiply token embeddings by sqrt(d_model), as the paper does
    dropout: float = 0.0
    bias: bool = True  # biases in the linear layers
    qkv_bias: bool | None = None  # biases on W_Q, W_K, W_V only (None: as `bias`; Qwen2: True)
    tie_embeddings: bool = True  # output projection shares the token embedding
    ln_eps: float = 1e-5
    type_vocab_size: int = 0  # token-type (segment) embeddings added on the input (BERT: 2)
    embed_norm: bool = False  # a norm right after the input embeddings (BERT)
    head_transform: bool = False  # dense, activation and norm before the output (BERT's MLM head)
    head_bias: bool = False  # a bias on the output projection (BERT's MLM head)
    # kept query heads per attention site, original ids (None: all n_head heads everywhere)
    kept_heads: tuple[tuple[int, ...], ...] | None = None
    # sliding-window attention (decoders): a query sees only the last `sliding_window` keys,
    # itself included, as transformers' Mistral and Qwen2 do (None: every earlier key)
    sliding_window: int | None = None
    # the layers (0-based) whose attention uses the window (None: every layer; Qwen2's
    # max_window_layers and Gemma's alternating local layers window only some)
    window_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "arch", choice(Arch, self.arch, "architecture", "arch"))
        set_(self, "pe", choice(PE, self.pe, "positional encoding", "pe"))
        set_(self, "scale", choice(Scale, self.scale, "attention scale", "scale"))
        set_(self, "norm", choice(Norm, self.norm, "norm placement", "norm"))
        set_(self, "ffn", choice(FFN, self.ffn, "FFN activation", "ffn"))
        set_(self, "norm_type", choice(NormType, self.norm_type, "norm type", "norm_type"))
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_len", "t5_buckets"):
            if int(getattr(self, name)) < 1:
                raise ProbeError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.n_dec_layer is not None and self.n_dec_layer < 1:
            raise ProbeError(f"n_dec_layer must be at least 1, got {self.n_dec_layer}.")
        if self.d_head is None:
            if self.d_model % self.n_head:
                raise ProbeError(
                    f"d_model ({self.d_model}) is not divisible by n_head ({self.n_head}); "
                    "pick sizes that divide or set d_head explicitly."
                )
            set_(self, "d_head", self.d_model // self.n_head)
        if self.d_head < 1:
            raise ProbeError(f"d_head must be at least 1, got {self.d_head}.")
        if not 0.0 < self.rope_fraction <= 1.0:
            raise ProbeError(f"rope_fraction must be in (0, 1], got {self.rope_fraction}.")
        if self.pe == PE.ROPE and self.rotary_dims < 2:
            raise ProbeError(
                f"rope_fraction {self.rope_fraction} of d_head {self.d_head} (d_model "
                f"{self.d_model}, n_head {self.n_head}) rotates no dimension; use fewer heads, a "
                "wider d_head or a larger rope_fraction."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ProbeError(f"dropout must be in [0, 1), got {self.dropout}.")
        if not 0 < self.ffn_mult < math.inf:  # NaN too
            raise ProbeError(f"ffn_mult must be a positive finite number, got {self.ffn_mult}.")
        if not self.rope_base > 1:
            raise ProbeError(
                f"rope_base must be greater than 1 (usually 10000), got {self.rope_base}."
            )
        if self.t5_max_distance < 1:
            raise ProbeError(f"t5_max_distance must be at least 1, got {self.t5_max_distance}.")
        if not self.ln_eps > 0:
            raise ProbeError(f"ln_eps must be positive, got {self.ln_eps}.")
        if self.log_scale_len is not None and self.log_scale_len < 2:
            raise ProbeError(
                f"log_scale_len (L_train) must be at least 2, got {self.log_scale_len}."
            )
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ProbeError(
                f"n_kv_head must divide n_head ({self.n_head}) into equal groups, "
                f"got {self.n_kv_head}."
            )
        if self.type_vocab_size < 0:
            raise ProbeError(f"type_vocab_size must not be negative, got {self.type_vocab_size}.")
        self._check_window()
        self._check_variants()
        if self.kept_heads is not None:
            kept = tuple(tuple(int(h) for h in site) for site in self.kept_heads)
            set_(self, "kept_heads", kept)
            if len(kept) != self.n_sites:
                raise ProbeError(
                    f"kept_heads lists {len(kept)} attention sites but the model has "
                    f"{self.n_sites}."
                )
            self.sites()  # each site checks its head ids

    def _check_variants(self) -> None:
        """The fields of the modern families: each alone, and with what it needs."""
        for name in ("scale_dim", "attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ProbeError(f"{name} must be a positive number, got {value}.")
        if self.scale_dim is not None and self.scale != Scale.SQRT:
            raise ProbeError(f"scale_dim sets the d of 1/sqrt(d): it needs scale 'sqrt', got "
                             f"'{self.scale}'.")  # fmt: skip
        if not math.isfinite(self.norm_offset):
            raise ProbeError(f"norm_offset must be a finite number, got {self.norm_offset}.")
        if (self.norm_offset or self.norm_gain_float32) and self.norm_type != NormType.RMS:
            raise ProbeError("norm_offset and norm_gain_float32 describe RMSNorm's gain; they "
                             "need norm_type 'rms'.")  # fmt: skip
        if self.parallel_residual and (self.norm != Norm.PRE or self.ffn == FFN.NONE):
            raise ProbeError("parallel_residual adds attention and FFN of the same normed input; "
                             "it needs norm 'pre' and an FFN.")  # fmt: skip
        if self.qk_norm_whole and not self.qk_norm:
            raise ProbeError("qk_norm_whole says how qk_norm spans the heads; set qk_norm too.")
        self._check_rotary()

    def _check_rotary(self) -> None:
        """The rotary fields beyond base and fraction: each needs pe 'rope', and what it
        names must fit the model."""
        for name in ("rope_scaling", "rope_local_scaling"):
            scaling = getattr(self, name)
            if isinstance(scaling, dict):  # as a study file or checkpoint writes it
                scaling = field_value(RopeScaling, name, scaling, "model")
                object.__setattr__(self, name, scaling)
            if not isinstance(scaling, RopeScaling):
                raise ProbeError(f"{name} must be a rotary scaling, got {scaling!r:.60}.")
            if not scaling.plain and self.pe != PE.ROPE:
                raise ProbeError(f"{name} scales rotary positions: it needs pe 'rope'.")
            scaling.check_dims(self.rotary_dims)
        if self.rope_local_base is not None:
            if self.pe != PE.ROPE or self.sliding_window is None:
                raise ProbeError("rope_local_base is the rotary base of the sliding-window "
                                 "layers: it needs pe 'rope' and sliding_window.")  # fmt: skip
            if not self.rope_local_base > 1:
                raise ProbeError(
                    f"rope_local_base must be greater than 1, got {self.rope_local_base}."
                )
        elif not self.rope_local_scaling.plain:
            raise ProbeError("rope_local_scaling scales the sliding-window layers' own rotary: "
                             "it needs rope_local_base.")  # fmt: skip
        if self.nope_layers is not None:
            layers = tuple(int(i) for i in self.nope_layers)
            if len(set(layers)) != len(layers) or not set(layers) <= set(range(self.n_layer)):
                raise ProbeError(f"nope_layers must list distinct layers in "
                                 f"0..{self.n_layer - 1}, got {list(layers)}.")  # fmt: skip
            if self.pe != PE.ROPE or self.arch == Arch.ENCODER_DECODER:
                raise ProbeError("nope_layers names the layers without rotary: it needs pe "
                                 "'rope' and a decoder or encoder.")  # fmt: skip
            object.__setattr__(self, "nope_layers", tuple(sorted(layers)))

    def rotary(self, layer: int) -> tuple[float, RopeScaling] | None:
        """(base, scaling) of the rotary embedding of decoder or encoder layer `layer`'s
        self-attention, or None where it has none."""
        if self.pe != PE.ROPE or (self.nope_layers is not None and layer in self.nope_layers):
            return None
        if self.rope_local_base is not None and self.window(layer) is not None:
            return self.rope_local_base, self.rope_local_scaling
        return self.rope_base, self.rope_scaling

    def _check_window(self) -> None:
        if self.sliding_window is None:
            if self.window_layers is not None:
                raise ProbeError("window_layers is set but sliding_window is not; set both.")
            return
        if not 1 <= self.sliding_window <= MAX_WINDOW:
            raise ProbeError(f"sliding_window must be at least 1 and at most 2**40 tokens (past "
                             f"any context: leave it unset for no window), got "
                             f"{self.sliding_window}.")  # fmt: skip
        if self.arch != Arch.DECODER:
            raise ProbeError(
                f"sliding_window needs arch 'decoder' (causal self-attention), got '{self.arch}'."
            )
        if self.window_layers is not None:
            layers = tuple(int(i) for i in self.window_layers)
            distinct = len(set(layers)) == len(layers) and set(layers) <= set(range(self.n_layer))
            if not layers or not distinct:
                raise ProbeError(
                    f"window_layers must list distinct layers in 0..{self.n_layer - 1}, got "
                    f"{list(layers)} (leave sliding_window unset for no window)."
                )
            object.__setattr__(self, "window_layers", tuple(sorted(layers)))

    def window(self, layer: int) -> int | None:
        """The sliding window of decoder layer `layer` (None: it sees every earlier key)."""
        if self.window_layers is not None and layer not in self.window_layers:
            return None
        return self.sliding_window

    @property
    def norm_before(self) -> bool:
        """Whether each sub-layer normalises its input (pre and sandwich norms)."""
        return self.norm in (Norm.PRE, Norm.SANDWICH)

    @property
    def decoder_layers(self) -> int:
        return self.n_dec_layer if self.n_dec_layer is not None else self.n_layer

    @property
    def d_ff(self) -> int:
        return max(1, round(self.d_model * self.ffn_mult))

    @property
    def rotary_dims(self) -> int:
        """Dimensions of each head that rotary rotates (even)."""
        return int(self.d_head * self.rope_fraction) // 2 * 2

    @property
    def causal(self) -> bool:
        return self.arch != Arch.ENCODER

    @property
    def kv_heads(self) -> int:
        """Key/value heads per site before any pruning."""
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def max_positions(self) -> int | None:
        """The longest input a model can take: a learned table's rows, else None (any length)."""
        return self.max_len if self.pe == PE.LEARNED else None

    @property
    def n_sites(self) -> int:
        if self.arch == Arch.ENCODER_DECODER:
            return self.n_layer + 2 * self.decoder_layers
        return self.n_layer

    def sites(self) -> list[Site]:
        """The attention sub-layers, in the order tables number them as `layer`.

        Names are module paths: an encoder-decoder has `encoder.i.attn`, then `blocks.i.attn`
        (causal self-attention) and `blocks.i.cross` (cross-attention) per decoder block."""
        specs: list[tuple[str, bool, bool, int | None]] = []  # name, cross, causal, window
        if self.arch == Arch.ENCODER_DECODER:
            specs += [(f"encoder.{i}.attn", False, False, None) for i in range(self.n_layer)]
            for i in range(self.decoder_layers):
                specs += [(f"blocks.{i}.attn", False, True, None)]
                specs += [(f"blocks.{i}.cross", True, False, None)]
        else:
            specs = [
                (f"blocks.{i}.attn", False, self.causal, self.window(i))
                for i in range(self.n_layer)
            ]
        kept = self.kept_heads or [tuple(range(self.n_head))] * len(specs)
        return [
            Site(name, i, cross, causal, self.n_head, self.kv_heads, heads, window)
            for i, ((name, cross, causal, window), heads) in enumerate(
                zip(specs, kept, strict=True)
            )
        ]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if isinstance(data, dict) and "heads" in data and "kept_heads" not in data:
            data = {("kept_heads" if k == "heads" else k): v for k, v in data.items()}  # before 0.2
        if isinstance(data, dict) and "rope_linear_factor" in data:  # before rope_scaling
            data = dict(data)
            factor = data.pop("rope_linear_factor")
            if factor != 1.0 and "rope_scaling" not in data:
                data["rope_scaling"] = {"kind": "linear", "factor": factor}
        return from_dict(cls, data, "model")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)
