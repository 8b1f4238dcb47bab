"""What a head study is: its model, its text and the options of each measurement, as frozen
dataclasses (spec.py reads them from a study file, checks.py checks their values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.rope_experiment import RopeRequest
from probe.study.verdicts.contrast import Contrast
from probe.study.verdicts.expect import Expectation


@dataclass(frozen=True)
class TextOptions:
    file: str = ""  # a text file (relative to the study file); "" is the shipped corpus
    whole: bool = False  # the whole file as one document (else blank-line paragraphs)
    max_tokens: int = 128  # tokens per row
    batch_size: int = 8
    batches: int = 4  # batches per set: one importance set per seed, one scoring set
    seeds: int = 3  # disjoint importance sets (seed r also seeds the random baseline)


@dataclass(frozen=True)
class ImportanceOptions:
    methods: tuple[str, ...] = ()  # head estimators compared by rank agreement


@dataclass(frozen=True)
class CurveOptions:
    methods: tuple[str, ...] = ()  # by query head: estimators, "fisher+tune", "attention-layer"
    group_methods: tuple[str, ...] = ()  # by whole key/value group: estimators
    fractions: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class RoleOptions:
    enabled: bool = False
    period: int = 16  # repeated random sequences for induction
    needles: int = 0  # needle-in-a-haystack prompts for retrieval heads (causal LMs; 0: none)
    context: int = 256  # tokens per needle prompt


@dataclass(frozen=True)
class KnockoutOptions:
    heads: tuple[int, ...] = ()  # remove the top-k retrieval heads, for each k
    draws: int = 10  # against k random heads, this many draws
    prompts: int = 20  # fresh needle prompts (not the ones the scores came from)


@dataclass(frozen=True)
class KVOptions:
    # key/value-cache plans (probe.kv): heads chosen by each method keep the full cache, the rest
    # stream (sink + window); "full" and "streaming" are measured beside them. No lengths: off.
    methods: tuple[str, ...] = ()  # retrieval, razor, duo, random
    full_shares: tuple[float, ...] = ()  # shares of key/value heads keeping the full cache
    sink: int = 4
    window: int = 64
    lengths: tuple[int, ...] = ()  # passkey prompt lengths (tokens)
    needles: int = 3  # passkey prompts per length and seed (depths spread over the haystack)
    seeds: int = 3  # seeds of passkeys, haystacks and text rows (and of the random plans)
    loss_tokens: int = 1024  # tokens per text row scored by loss
    loss_rows: int = 2  # text rows per seed
    score_needles: int = 20  # retrieval: needle prompts Wu et al.'s score is computed on
    score_context: int = 256  # retrieval: tokens per needle prompt
    razor_period: int = 64  # razor: repeated random sequences (echo and induction)
    razor_rows: int = 8
    duo_steps: int = 40  # duo: gate training (probe.kv.duo)
    duo_lr: float = 0.05
    duo_l1: float = 0.05


@dataclass(frozen=True)
class HealOptions:
    # healing pruned models by distillation (probe.heal): each method removes `fraction` of the
    # query heads (probe.heal.prune), then each seed heals the pruned model from the unpruned
    # one on the shipped manuals corpus, measured on its held-out pages. No methods: off.
    methods: tuple[str, ...] = ()  # fisher+tune (ragged), fisher-group, fisher-uniform
    fraction: float = 1 / 3  # share of the query heads removed
    tokens: int = 131072  # distillation tokens per run (whole steps)
    seq_len: int = 512  # tokens per row
    batch_tokens: int = 8192  # tokens per optimizer step
    lr: float = 1e-4  # peak learning rate (AdamW)
    warmup: float = 0.1  # share of the steps warming up
    temperature: float = 1.0
    eval_tokens: int = 32768  # held-out tokens perplexity is measured on
    eval_at: tuple[int, ...] = ()  # steps measured after (empty: 1, 2, 4, ... and the last)
    seeds: int = 2  # orders of the training rows (the pruned model is the same for every seed)
    max_batch_tokens: int = 2048  # tokens one forward and backward pass holds (memory)
    speed_repeats: int = 3  # llama.cpp timings of the exported models, once the rest is done
    # (0: none; the step needs llama-cpp-python, scripts/llama-cpp.sh)

    def config(self, seed: int = 0):
        """The `probe.heal.config.HealConfig` of one seed's run."""
        from probe.heal.config import HealConfig

        return HealConfig(tokens=self.tokens, seq_len=self.seq_len,
                          batch_tokens=self.batch_tokens, lr=self.lr, warmup=self.warmup,
                          temperature=self.temperature, eval_tokens=self.eval_tokens,
                          eval_at=self.eval_at or None, seed=seed)  # fmt: skip


@dataclass(frozen=True)
class TimingOptions:
    fractions: tuple[float, ...] = ()  # pruned models timed at these fractions (and the
    # operating point of every curve method)
    batch_sizes: tuple[int, ...] = (1, 8)
    repeats: int = 3
    threads: int = 1


@dataclass(frozen=True)
class OperatingOptions:
    tolerance: float = 0.01  # how far the primary metric may move from the unpruned model's:
    # similarity may fall by this much, loss (nats) may rise by this much


@dataclass(frozen=True)
class HeadStudy:
    name: str
    question: str
    source: str  # what `probe import` takes
    path: Path | None = None
    # [model] rope_scaling: the model's rotary layers run, training-free, with this scaling
    # instead of their own (its context, where not given, the model's max_position_embeddings)
    rope_scaling: RopeRequest | None = None
    description: str = ""
    title: str = ""
    text: TextOptions = TextOptions()
    importance: ImportanceOptions = ImportanceOptions()
    curves: CurveOptions = CurveOptions()
    roles: RoleOptions = RoleOptions()
    knockout: KnockoutOptions = KnockoutOptions()
    kv: KVOptions = KVOptions()
    heal: HealOptions = HealOptions()
    timing: TimingOptions = TimingOptions()
    operating: OperatingOptions = OperatingOptions()
    expectations: tuple[Expectation, ...] = ()  # checked on the tables after a run
    contrasts: tuple[Contrast, ...] = ()  # claims tested over seeds (the report's verdicts)
    smoke: dict[str, Any] | None = field(default=None, compare=False)
    is_smoke: bool = False

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else "study"

    def text_file(self) -> Path | None:
        if not self.text.file:
            return None
        base = self.path.parent if self.path is not None else Path.cwd()
        return base / self.text.file
