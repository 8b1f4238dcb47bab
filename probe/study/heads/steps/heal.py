"""The healing steps: seed s of each pruning method (`probe.heal.prune`) removes the [heal]
fraction of the query heads as ranked on importance split s, heals that pruned model by
distillation from the unpruned model (`probe.heal.loop`) on the training pages of the shipped
manuals corpus, the seed ordering the rows, and measures perplexity before and after the steps
asked for on held-out text the seed draws (`probe.heal.heldout`: pages of every project,
de-duplicated against the training pages), so the seeds vary every choice the method makes. A
`heal-text` step per seed records that held-out text (pages and tokens of each project, what
de-duplication dropped). The [heal] section of the study file is declared here; the report's
sections, the answer's sentence and the claim on them are in `probe.study.heads.heal_report`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from probe.data.docs import docs_corpus
from probe.errors import ProbeError
from probe.interop.llama_cpp import llama_cpp_version
from probe.options import option
from probe.study.heads.heal_report import heal_answer, healing_section, minitron, speed_section
from probe.study.heads.step import Claim, Later, Options, Section, StepKind, StudySection
from probe.study.heads.study import HeadStudy

if TYPE_CHECKING:
    from probe.study.heads.subject import Subject


@dataclass(frozen=True)
class HealOptions:
    # healing pruned models by distillation (probe.heal): each method removes `fraction` of the
    # query heads (probe.heal.prune), then each seed heals the pruned model from the unpruned
    # one on the shipped manuals corpus, measured on its held-out pages. No methods: off.
    methods: tuple[str, ...] = ()  # fisher+tune (ragged), fisher-group, fisher-uniform
    fraction: float = option(1 / 3, low=1e-9, high=0.999,
                             help="share of the query heads removed")  # fmt: skip
    # distillation tokens per run (whole steps)
    tokens: int = option(131072, low=1, help="distillation tokens per run")
    seq_len: int = option(512, low=2, help="tokens per row")
    batch_tokens: int = option(8192, low=2, help="tokens per optimizer step")
    lr: float = option(1e-4, low=1e-12, help="peak learning rate")  # AdamW
    warmup: float = option(0.1, low=0, high=0.99, help="share of the steps warming up")
    temperature: float = option(1.0, low=1e-6, help="temperature of the distributions")
    # held-out tokens perplexity is measured on
    eval_tokens: int = option(32768, low=2, help="held-out tokens")
    # a held-out sentence sharing this many consecutive words with a training page is dropped
    ngram: int = option(13, low=1, help="words held-out text may not share with training")
    # the projects take turns by passages of at most this many words (probe.heal.heldout)
    passage: int = option(512, low=1, help="words of a held-out passage")
    # steps measured after (empty: 1, 2, 4, ... and the last)
    eval_at: tuple[int, ...] = option((), low=1, help="steps measured after")
    # seed s prunes on importance split s ([text] seeds holds them), orders the training rows
    # and draws the held-out text
    seeds: int = option(2, low=1, help="pruning splits, row orders and held-out samples")
    # tokens one forward and backward pass holds (memory)
    max_batch_tokens: int = option(2048, low=1, help="tokens one pass holds")
    # llama.cpp timings of the exported models, once the rest is done (0: none; the step needs
    # llama-cpp-python, scripts/llama-cpp.sh)
    speed_repeats: int = option(3, low=0, help="llama.cpp timings; 0 turns them off")

    def config(self, seed: int = 0):
        """The `probe.heal.config.HealConfig` of one seed's run."""
        from probe.heal.config import HealConfig

        return HealConfig(tokens=self.tokens, seq_len=self.seq_len,
                          batch_tokens=self.batch_tokens, lr=self.lr, warmup=self.warmup,
                          temperature=self.temperature, eval_tokens=self.eval_tokens,
                          eval_at=self.eval_at or None, seed=seed)  # fmt: skip


def _methods() -> tuple[str, ...]:
    from probe.heal.prune import METHODS

    return tuple(METHODS)


def _check(study: HeadStudy) -> None:
    """The [heal] settings fit together (a step of whole rows, the steps measured after, an
    importance split for every seed)."""
    if not study.heal.methods:
        return
    if study.heal.seeds > study.text.seeds:
        raise ProbeError(f"{study.where} [heal] seeds = {study.heal.seeds}: seed s prunes on "
                         f"importance split s, but [text] seeds = {study.text.seeds} makes "
                         f"{study.text.seeds}; raise [text] seeds to {study.heal.seeds} or "
                         "lower [heal] seeds.")  # fmt: skip
    try:
        study.heal.config()
    except ProbeError as exc:
        words = str(exc).replace("--", "").replace("-", "_")
        raise ProbeError(f"{study.where} [heal]: {words}") from None


def _fit(subject: Subject) -> None:
    """Healing distills next-token distributions: a causal language model, rows within its
    positions, and no more tokens than the manuals corpus holds."""
    from probe.study.heads.checks import causal_within

    study = subject.study
    heal, where = study.heal, study.where
    if not heal.methods:
        return
    causal_within(subject, "heal", "healing distills next-token distributions, so it needs",
                  f"seq_len = {heal.seq_len} is", heal.seq_len, "(or its methods)")  # fmt: skip
    cfg = heal.config()
    size = sum(len(d.encode()) + 1 for d in docs_corpus("train"))  # a token is a byte or more
    if cfg.steps * cfg.step_tokens > size:  # the step's own count comes after minutes of work
        raise ProbeError(
            f"{where} [heal] tokens = {heal.tokens:,} is more than the training pages of the "
            f"manuals corpus hold ({size:,} bytes, a token each at most); lower it."
        )


HEAL = StudySection("heal", 60, HealOptions, check=_check, fit=_fit, methods=_methods,
                    listed=lambda o: o.methods)  # fmt: skip


def step_key(method: str, seed: int) -> str:
    return f"heal-{method}-{seed}"


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    h = study.heal
    common = {
        "fraction": h.fraction,
        "max_batch_tokens": h.max_batch_tokens,
        "ngram": h.ngram,
        "passage": h.passage,
        **h.config().to_dict(),
    }
    common.pop("seed")
    # seed by seed, so parallel workers start on different methods
    return [(step_key(method, seed), {**common, "method": method, "seed": seed})
            for seed in range(h.seeds) for method in h.methods]  # fmt: skip


def _plan_text(study: HeadStudy) -> list[tuple[str, Options]]:
    h = study.heal
    if not h.methods:
        return []
    text = {"ngram": h.ngram, "passage": h.passage, "eval_tokens": h.eval_tokens,
            "seq_len": h.seq_len}  # fmt: skip
    return [(f"heal-text-{seed}", {**text, "seed": seed}) for seed in range(h.seeds)]


def _heldout(subject: Subject, seed: int, options: Options):
    """Seed `seed`'s held-out text (`probe.heal.heldout.HeldOut`) by the step's `ngram` and
    `passage`, drawn once per process."""
    from probe.heal.heldout import heldout_sample

    key = ("heal-heldout", seed, int(options["ngram"]), int(options["passage"]))
    if key not in subject.memo:
        subject.memo[key] = heldout_sample(*key[1:])
    return subject.memo[key]


def heldout_text(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """Per project, seed's held-out text (`HeldOut.usage`): the pages held out and kept after
    de-duplication, the sentences and words dropped, and the pages and tokens of the rows the
    heal steps measure perplexity on (eval_tokens // seq_len rows of seq_len tokens)."""
    tokenizer = subject.imported.tokenizer
    sample = _heldout(subject, int(options["seed"]), options)
    rows = options["eval_tokens"] // options["seq_len"]
    text = options["seq_len"] - tokenizer.num_special_tokens_to_add(is_pair=False)  # per row

    def count(piece: str) -> int:
        return len(tokenizer.encode(piece, add_special_tokens=False).ids)

    return sample.usage(count, rows * text)


def _pruned_folder(subject: Subject, method: str, fraction: float, split: int):
    """Where `_pruned` keeps `method`'s pruned model on importance split `split`: named by a
    digest of the model, the text options, the method, the fraction and the split."""
    text = json.dumps([subject.study.text.__dict__, method, fraction, subject.digest, split],
                      sort_keys=True, default=str)  # fmt: skip
    return subject.workdir / f"heal-pruned-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _work(subject: Subject, options: Options):
    """The folder a heal step keeps its resume state in: named by the step and a digest of its
    options and its pruned model, so a step recomputed because the model, the [text] options or
    its own options changed never resumes a state saved for the old ones (the same shapes would
    load without a complaint). The states of the step's earlier digests are removed: the study
    made them, and their step is gone from its cache."""
    from probe.heal.state import clear_state

    key = step_key(options["method"], int(options["seed"]))
    pruned = _pruned_folder(subject, options["method"], float(options["fraction"]),
                            int(options["seed"]))  # fmt: skip
    text = json.dumps([options, pruned.name], sort_keys=True, default=str)
    work = subject.workdir / f"{key}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    clear_state(subject.workdir / key)  # where states were kept before: the step's own folder
    for old in subject.workdir.glob(f"{key}-*"):
        if old != work and old.is_dir() and not old.is_symlink():
            clear_state(old)
            with contextlib.suppress(OSError):  # anything else in it: not heal's to remove
                old.rmdir()
    return work


def _pruned(subject: Subject, method: str, fraction: float, split: int):
    """The pruned model of `method` on importance split `split`: made once per run and kept in
    the run's steps/ folder (named by a digest of the model, the text, the method and the
    split), so the heal step of that seed and the llama.cpp timings (split 0), in any worker,
    use one model; workers prune one at a time (a lock), since pruning with mask tuning holds
    several copies of the model's activations."""
    import fcntl
    import shutil

    from probe.checkpoint import load_checkpoint, save_checkpoint
    from probe.heal.prune import prune_for_healing

    folder = _pruned_folder(subject, method, fraction, split)
    key = ("heal-pruned", folder.name)
    if key in subject.memo:
        return subject.memo[key]
    subject.workdir.mkdir(parents=True, exist_ok=True)
    with (subject.workdir / ".heal-prune.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").is_file():
            sets, _ = subject.splits
            model = prune_for_healing(subject.model, sets[split], fraction, method)[0]
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            save_checkpoint(partial, model, None, None, source=subject.imported.source)
            partial.rename(folder)
        fcntl.flock(lock, fcntl.LOCK_UN)
    subject.memo[key] = load_checkpoint(folder, runtime=subject.runtime).model
    return subject.memo[key]


def heal_step(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """Rows (method, seed, stage, tokens, metric, value, heads, kv_heads, parameters): the
    original and pruned models' held-out perplexity and loss, and the healed model's after each
    measured step, on the seed's held-out text."""
    from probe.heal.loop import heal
    from probe.heal.state import clear_state

    method, seed = options["method"], int(options["seed"])
    cfg = subject.study.heal.config(seed)
    student = copy.deepcopy(_pruned(subject, method, float(options["fraction"]), seed))
    sample = _heldout(subject, seed, options)
    tokenizer = subject.imported.tokenizer
    work = _work(subject, options)

    def report(p) -> None:
        progress(p.step, cfg.steps)

    # a state the step cannot resume (damaged) is the study's own: it is discarded, as a
    # damaged cell is computed again
    result = heal(subject.model, student, docs_corpus("train"), sample.docs,
                  tokenizer, cfg, work, subject.runtime,
                  max_batch_tokens=subject.study.heal.max_batch_tokens,
                  identity={"method": method, "fraction": options["fraction"]},
                  progress=report, restart=True)  # fmt: skip
    clear_state(work)  # the table is the step's result; the engine stores it next
    sites = student.cfg.sites()
    table = result.table
    table.insert(0, "seed", seed)
    table.insert(0, "method", method)
    table["heads"] = sum(len(s.kept_heads) for s in sites)
    table["kv_heads"] = sum(len(s.kept_groups) for s in sites)
    table["parameters"] = student.parameter_counts()["total"]
    original = table.stage == "original"
    table.loc[original, "heads"] = sum(s.n_head for s in sites)
    table.loc[original, "kv_heads"] = sum(s.n_kv_head for s in sites)
    table.loc[original, "parameters"] = subject.model.parameter_counts()["total"]
    table.attrs["notes"] = {**result.notes, **sample.notes(), "importance_split": seed}
    return table


# ------------------------------------------------------------------------------ llama.cpp speed
SPEED = {"dtype": "float16", "prompt": 256, "new": 64, "ctx": 2048, "threads": 1}


def _plan_speed(study: HeadStudy, tables: dict[str, pd.DataFrame]):
    h = study.heal
    if not _speed_expected(study) or "heal" not in tables:
        return None
    return {"methods": list(h.methods), "fraction": h.fraction, "repeats": h.speed_repeats,
            "llama_cpp": llama_cpp_version(), "ngram": h.ngram, "passage": h.passage,
            **SPEED}, {}  # fmt: skip


def _speed_expected(study: HeadStudy) -> bool:
    return (
        bool(study.heal.methods)
        and study.heal.speed_repeats > 0
        and (llama_cpp_version() is not None)
    )


def llama_speed(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """The unpruned model and each method's pruned model of seed 0 (unhealed: healing changes
    weights, not shapes) exported as GGUF and run in llama.cpp (`probe.interop.llama_cpp`) on a
    prompt from seed 0's held-out text; with each file's architecture and head counts."""
    from probe.data.text import stream_rows
    from probe.interop.llama_cpp import export_and_measure
    from probe.runtime import resolve_dtype

    tokenizer = subject.imported.tokenizer
    models = {"original": subject.model}
    models |= {m: _pruned(subject, m, float(options["fraction"]), 0) for m in options["methods"]}
    heldout = _heldout(subject, 0, options).docs
    prompt = stream_rows(heldout, tokenizer, options["prompt"], 1)[0][0]
    table = export_and_measure(models, tokenizer, prompt.tolist(),
                               resolve_dtype(options["dtype"]), options["new"],
                               options["repeats"], options["threads"], options["ctx"],
                               progress)  # fmt: skip
    return table


SPEED_LATER = Later(_plan_speed, _speed_expected)
MINITRON = Claim("muralidharan2024", 90, minitron, ("muralidharan2024", "allal2025"))
DECLARES = (
    StepKind("heal", 9, heal_step, _plan, section=HEAL,
             reports=(Section("healing", 78, healing_section),), answer=heal_answer,
             claims=(MINITRON,)),
    StepKind("llama-cpp", 10, llama_speed, later=SPEED_LATER, section=HEAL,
             reports=(Section("llama-cpp", 79, speed_section),)),
    StepKind("heal-text", 11, heldout_text, _plan_text, section=HEAL),
)  # fmt: skip
