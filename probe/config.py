"""Frozen, validated configuration objects.

Every choice that has more than two values is a `StrEnum`; every config has `from_dict`, which
rejects unknown keys with a did-you-mean message and values of the wrong type by field name, and
`to_dict`, which is JSON-ready.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from probe.errors import ProbeError
from probe.fields import field_value

E = TypeVar("E", bound=StrEnum)
C = TypeVar("C")


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """' Did you mean 'x'?' when a close match exists, else ''."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def choice(enum: type[E], value: Any, what: str, field: str = "") -> E:
    """Coerce `value` to `enum`, with an error that lists the valid values (and names the config
    field `field`, when given)."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        valid = [m.value for m in enum]
        named = f" (field '{field}')" if field else ""
        raise ProbeError(
            f"Unknown {what} '{value}'{named}.{did_you_mean(str(value), valid)} "
            f"Available: {', '.join(valid)}."
        ) from None


def check_keys(table: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """`table` itself, once it is a dict whose keys are all in `allowed` (else a ProbeError
    naming `where`, the key and a suggestion)."""
    if not isinstance(table, dict):
        raise ProbeError(f"{where} must be a table, got {type(table).__name__}.")
    for key in table:
        if key not in allowed:
            raise ProbeError(
                f"{where}: unknown field '{key}'.{did_you_mean(key, list(allowed))} "
                f"Valid fields: {', '.join(allowed)}."
            )
    return table


def from_dict(cls: type[C], data: dict[str, Any], what: str) -> C:
    """Build dataclass `cls` from `data`, rejecting unknown keys and mistyped values by name."""
    if not isinstance(data, dict):
        raise ProbeError(f"{what} must be a table of settings, got {type(data).__name__}.")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            raise ProbeError(
                f"Unknown {what} field '{key}'.{did_you_mean(str(key), names)} "
                f"Valid fields: {', '.join(names)}."
            )
    hints = typing.get_type_hints(cls)
    return cls(**{key: field_value(hints[key], key, value, what) for key, value in data.items()})


def to_plain(value: Any) -> Any:
    """A config value as JSON has it: enums as strings, tuples as lists."""
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_plain(x) for x in value]
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (enums as strings, tuples as lists)."""
    return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


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
    POST = "post"  # x = LN(x + sublayer(x)), the paper
    PRE = "pre"  # x = x + sublayer(LN(x)), GPT-2 and later; adds a final LayerNorm


class FFN(StrEnum):
    RELU = "relu"  # the paper
    GELU = "gelu"  # BERT (exact erf form)
    GELU_TANH = "gelu-tanh"  # GPT-2 (tanh approximation)
    NONE = "none"  # attention-only blocks


class Schedule(StrEnum):
    """The learning rate over training."""

    COSINE = "cosine"  # linear warm-up to lr, then cosine decay to lr * lr_min_ratio
    PAPER = "paper"  # lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (the paper: lr = 1)


@dataclass(frozen=True)
class ModelConfig:
    arch: Arch = Arch.DECODER
    vocab_size: int = 32  # tokens, special tokens included
    n_layer: int = 2  # blocks (encoder blocks for encoder-decoder)
    n_dec_layer: int | None = None  # decoder blocks of an encoder-decoder (default n_layer)
    n_head: int = 4  # heads per attention sub-layer before any pruning
    d_model: int = 64  # residual stream width
    d_head: int | None = None  # per-head width of q, k, v (default d_model // n_head)
    ffn: FFN = FFN.RELU  # FFN activation, or none for attention-only blocks
    ffn_mult: float = 4.0  # FFN width as a multiple of d_model (the paper: 2048/512 = 4)
    norm: Norm = Norm.PRE
    pe: PE = PE.LEARNED
    max_len: int = 256  # positions a learned table holds; range for randomized positions
    rope_fraction: float = 1.0  # fraction of each head's dimensions that rotary rotates
    rope_base: float = 10000.0
    t5_buckets: int = 32  # relative-position buckets of the T5 bias
    t5_max_distance: int = 128  # distance where the T5 buckets stop growing
    scale: Scale = Scale.SQRT
    qk_norm: bool = False  # LayerNorm on q and k per head (Wortsman et al. 2023)
    log_scale_len: int | None = None  # L_train: multiply q.k by log(n)/log(L_train) when set
    embed_scale: bool = False  # multiply token embeddings by sqrt(d_model), as the paper does
    dropout: float = 0.0
    bias: bool = True  # biases in the linear layers
    tie_embeddings: bool = True  # output projection shares the token embedding
    ln_eps: float = 1e-5
    # kept heads per attention site, in original numbering (None: all n_head heads everywhere)
    heads: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "arch", choice(Arch, self.arch, "architecture", "arch"))
        set_(self, "pe", choice(PE, self.pe, "positional encoding", "pe"))
        set_(self, "scale", choice(Scale, self.scale, "attention scale", "scale"))
        set_(self, "norm", choice(Norm, self.norm, "norm placement", "norm"))
        set_(self, "ffn", choice(FFN, self.ffn, "FFN activation", "ffn"))
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
        if self.ffn_mult <= 0:
            raise ProbeError(f"ffn_mult must be positive, got {self.ffn_mult}.")
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
        if self.heads is not None:
            heads = tuple(tuple(int(h) for h in site) for site in self.heads)
            set_(self, "heads", heads)
            sites = self.attention_sites()
            if len(heads) != len(sites):
                raise ProbeError(
                    f"heads lists {len(heads)} attention sites but the model has {len(sites)}."
                )
            for site, kept in zip(sites, heads, strict=True):
                if len(set(kept)) != len(kept) or any(not 0 <= h < self.n_head for h in kept):
                    raise ProbeError(
                        f"heads for {site} must be distinct ids in 0..{self.n_head - 1}, "
                        f"got {kept}."
                    )

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

    def attention_sites(self) -> list[str]:
        """Names of the attention sub-layers, in the order tables number them as `layer`."""
        if self.arch == Arch.ENCODER_DECODER:
            enc = [f"encoder.{i}.attn" for i in range(self.n_layer)]
            dec = []
            for i in range(self.decoder_layers):
                dec += [f"decoder.{i}.attn", f"decoder.{i}.cross"]
            return enc + dec
        return [f"blocks.{i}.attn" for i in range(self.n_layer)]

    def kept_heads(self) -> list[tuple[int, ...]]:
        """Original ids of the heads each attention site holds."""
        if self.heads is not None:
            return list(self.heads)
        return [tuple(range(self.n_head)) for _ in self.attention_sites()]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return from_dict(cls, data, "model")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 400
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 40  # linear warm-up steps, then cosine decay to lr_min_ratio * lr
    lr_min_ratio: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm (0: no clipping, as in the paper)
    schedule: Schedule = Schedule.COSINE
    adam_eps: float = 1e-8  # the paper: 1e-9
    label_smoothing: float = 0.0  # on the training loss only (the paper: 0.1)
    train_len: tuple[int, int] = (4, 16)  # task lengths drawn uniformly, inclusive
    random_positions: bool = False  # Ruoss et al. 2023: sorted random positions from [0, max_len)
    seed: int = 0
    eval_every: int = 100  # steps between evaluations at the training lengths (0: only at the end)
    eval_batches: int = 2  # batches per length when evaluating
    stats_every: int = 0  # steps between per-head attention statistics (0: never)
    device: str = "auto"  # auto, cpu, cuda, cuda:1, ...
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes kept with the run

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "schedule", choice(Schedule, self.schedule, "schedule", "schedule")
        )
        lo, hi = (int(x) for x in self.train_len)
        object.__setattr__(self, "train_len", (lo, hi))
        if not 1 <= lo <= hi:
            raise ProbeError(f"train_len must be lo:hi with 1 <= lo <= hi, got {lo}:{hi}.")
        for name in ("steps", "batch_size", "eval_batches"):
            if getattr(self, name) < 1:
                raise ProbeError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ProbeError(f"lr must be a positive number, got {self.lr}.")
        if not self.weight_decay >= 0:
            raise ProbeError(f"weight_decay must not be negative, got {self.weight_decay}.")
        if not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ProbeError(f"lr_min_ratio must be in [0, 1], got {self.lr_min_ratio}.")
        if not 0 <= self.seed < 2**63:
            raise ProbeError(f"seed must be in [0, 2**63), got {self.seed}.")
        if self.warmup < 0 or self.eval_every < 0 or self.stats_every < 0:
            raise ProbeError("warmup, eval_every and stats_every must not be negative.")
        if self.schedule == Schedule.PAPER and self.warmup < 1:
            raise ProbeError("the paper's schedule needs warmup of at least 1 step.")
        if not self.grad_clip >= 0:
            raise ProbeError(f"grad_clip must be 0 (off) or positive, got {self.grad_clip}.")
        if not self.adam_eps > 0:
            raise ProbeError(f"adam_eps must be positive, got {self.adam_eps}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ProbeError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}.")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return from_dict(cls, data, "train")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)
