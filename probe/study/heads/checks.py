"""What a head study file may say, checked when it is loaded (by `probe study validate` and at
the start of `probe study run`, before anything is computed).

Types are checked by `from_dict` against the option dataclasses; this module checks the values:
the range of every number (`LIMITS`), the shape of every list (fractions sorted, without
repeats, curves starting at 0.0), the model source (an installed bundled model, a Hugging Face
folder or a GGUF file) and the text file (a UTF-8 text file with enough text for the rows the
study asks for). Every error is one line naming the file, the section, the field and what was
expected.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Any

from probe.data.text import default_corpus, stream_rows
from probe.errors import ProbeError
from probe.interop.bundled import MODELS, PREFIX, bundled_path
from probe.interop.families import family
from probe.pruning.heads import present_heads
from probe.study.documents import read_json
from probe.study.heads.study import HeadStudy
from probe.words import counted

GGUF_MAGIC = b"GGUF"
SNIFF = 1 << 16  # bytes of a text file read to tell text from binary


def _cpus() -> int:
    return os.cpu_count() or 1


# section -> field -> (smallest, largest or a callable giving it, what it is); a list field's
# bound holds for each of its entries
LIMITS: dict[str, dict[str, tuple[float, Any, str]]] = {
    "text": {
        "max_tokens": (2, None, "tokens per row"),
        "batch_size": (1, None, "rows per batch"),
        "batches": (1, None, "batches per split"),
        "seeds": (1, None, "disjoint importance splits"),
    },
    "roles": {
        "period": (2, None, "tokens repeated for induction"),
        "needles": (0, None, "needle prompts; 0 turns retrieval off"),
        "context": (64, None, "tokens per needle prompt"),
    },
    "knockout": {
        "heads": (1, None, "retrieval heads masked"),
        "draws": (1, None, "random draws per k"),
        "prompts": (1, None, "fresh needle prompts"),
    },
    "kv": {
        "full_shares": (0, 1, "shares of key/value heads keeping the full cache"),
        "sink": (0, 2**40, "first tokens a streaming head keeps"),
        "window": (1, 2**40, "recent tokens a streaming head keeps"),
        "lengths": (64, None, "tokens per passkey prompt"),
        "needles": (1, None, "passkey prompts per length and seed"),
        "seeds": (1, None, "seeds of prompts, text rows and random plans"),
        "loss_tokens": (16, None, "tokens per text row scored by loss"),
        "loss_rows": (1, None, "text rows per seed"),
        "score_needles": (1, None, "needle prompts for retrieval scores"),
        "score_context": (64, None, "tokens per retrieval needle prompt"),
        "razor_period": (2, None, "tokens repeated for echo and induction"),
        "razor_rows": (1, None, "repeated sequences for echo and induction"),
        "duo_steps": (1, None, "duo's gate training steps"),
        "duo_lr": (1e-9, None, "duo's learning rate"),
        "duo_l1": (0, None, "duo's L1 weight"),
    },
    "heal": {
        "fraction": (1e-9, 0.999, "share of the query heads removed"),
        "tokens": (1, None, "distillation tokens per run"),
        "seq_len": (2, None, "tokens per row"),
        "batch_tokens": (2, None, "tokens per optimizer step"),
        "lr": (1e-12, None, "peak learning rate"),
        "warmup": (0, 0.99, "share of the steps warming up"),
        "temperature": (1e-6, None, "temperature of the distributions"),
        "eval_tokens": (2, None, "held-out tokens"),
        "eval_at": (1, None, "steps measured after"),
        "seeds": (1, None, "orders of the training rows"),
        "max_batch_tokens": (1, None, "tokens one pass holds"),
        "speed_repeats": (0, None, "llama.cpp timings; 0 turns them off"),
    },
    "timing": {
        "batch_sizes": (1, None, "rows per timed batch"),
        "repeats": (1, None, "timed repeats"),
        "threads": (1, _cpus, "torch threads, at most this machine's CPU count"),
    },
    "operating": {"tolerance": (0, None, "how far the primary metric may move")},
}


def check_values(study: HeadStudy) -> None:
    """Every number and list of `study` within its range (ProbeError naming the field)."""
    where = study.where
    for section, fields in LIMITS.items():
        options = getattr(study, section)
        for name, (low, high, what) in fields.items():
            value = getattr(options, name)
            high = high() if callable(high) else high
            for v in value if isinstance(value, tuple) else (value,):
                if v < low or (high is not None and v > high):
                    span = (f"at least {low:g}" if high is None
                            else f"at least {low:g} and at most {high:,}" if isinstance(high, int)
                            else f"from {low:g} to {high:g}")  # fmt: skip
                    raise ProbeError(
                        f"{where} [{section}] {name} must be {span} ({what}), got {v!r}."
                    )
            if isinstance(value, tuple) and len(set(value)) < len(value):
                raise ProbeError(f"{where} [{section}] {name} lists a value twice: {list(value)}.")
    for section, name in (("importance", "methods"), ("curves", "methods"),
                          ("curves", "group_methods"), ("kv", "methods"),
                          ("heal", "methods")):  # fmt: skip
        methods = getattr(getattr(study, section), name)
        if len(set(methods)) < len(methods):
            raise ProbeError(f"{where} [{section}] {name} lists a method twice: {list(methods)}.")
    _check_fractions(study)


def _check_fractions(study: HeadStudy) -> None:
    where = study.where
    curves, timing = study.curves.fractions, study.timing.fractions
    for section, values in (("curves", curves), ("timing", timing)):
        if list(values) != sorted(set(values)):
            raise ProbeError(
                f"{where} [{section}] fractions must increase, without repeats: got {list(values)}."
            )
    for f in curves:
        if not 0.0 <= f <= 1.0:
            raise ProbeError(
                f"{where} [curves] fractions must lie in [0, 1] (shares of the heads removed), "
                f"got {f}."
            )
    for f in timing:
        if not 0.0 < f < 1.0:
            raise ProbeError(
                f"{where} [timing] fractions must lie strictly between 0 and 1 (a model with "
                f"none or all of its heads removed is not timed), got {f}."
            )
    prunes = study.curves.methods or study.curves.group_methods
    if prunes and (not curves or curves[0] != 0.0 or len(curves) < 2):
        raise ProbeError(
            f"{where} [curves] fractions must start at 0.0 (the unpruned model every point is "
            f"compared with) and go on to at least one larger share, got {list(curves)}."
        )


def check_source(source: str, where: str) -> Path:
    """The path of the model `source` names: an installed bundled model, a Hugging Face folder
    (config.json and safetensors weights) or a GGUF file; else one line saying what it is."""
    here = f"{where} [model] source"
    if source.startswith(PREFIX):
        name = source[len(PREFIX) :]
        try:
            return bundled_path(name)
        except ProbeError as exc:
            raise ProbeError(f"{here}: {exc}") from None
    if source in MODELS:
        raise ProbeError(f"{here}: '{source}' is no path; a bundled model is '{PREFIX}{source}'.")
    path = Path(source)
    expected = ("a bundled model (bundled:minilm), a Hugging Face model folder (config.json and "
                "model.safetensors) or a .gguf file")  # fmt: skip
    if not path.exists():
        raise ProbeError(
            f"{here}: nothing at '{path}' (relative to the working directory); give {expected}."
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ProbeError(f"{here}: '{path}' is a file but not a .gguf; give {expected}.")
        try:
            with path.open("rb") as handle:
                magic = handle.read(4)
        except OSError as exc:
            raise ProbeError(f"{here}: '{path}' cannot be read: {exc.strerror or exc}.") from None
        if magic != GGUF_MAGIC:
            raise ProbeError(f"{here}: '{path}' is not a GGUF file (it does not begin with GGUF).")
        return path
    if not path.is_dir():
        raise ProbeError(f"{here}: '{path}' is neither a file nor a folder; give {expected}.")
    config = path / "config.json"
    if not config.is_file():
        raise ProbeError(f"{here}: '{path}' is a folder without config.json; give {expected}.")
    _check_hf_config(config, here)
    if not any((path / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        raise ProbeError(
            f"{here}: '{path}' has no model.safetensors (nor a shard index); a head study reads "
            "safetensors weights only."
        )
    return path


def _check_hf_config(config: Path, here: str) -> None:
    try:
        doc = read_json(config)
    except ProbeError as exc:
        raise ProbeError(f"{here}: {exc}") from None
    if not isinstance(doc, dict):
        raise ProbeError(f"{here}: {config} does not hold a JSON object.")
    if doc.get("format") == "probe-checkpoint":
        origin = doc.get("source", {}).get("path") if isinstance(doc.get("source"), dict) else None
        hint = f" (it was imported from '{origin}')" if isinstance(origin, str) else ""
        raise ProbeError(
            f"{here}: '{config.parent}' is a probe checkpoint; a head study imports its model "
            f"itself: give the Hugging Face folder, GGUF file or bundled model{hint}."
        )
    try:
        family(doc, str(config))  # an architecture probe cannot import, named now
    except ProbeError as exc:
        raise ProbeError(f"{here}: {exc}") from None


def check_text(study: HeadStudy) -> None:
    """The [text] file is a UTF-8 text file, and it (or the shipped corpus) holds at least one
    character for each token the study's rows take: a token covers at least one character."""
    here = f"{study.where} [text] file"
    path = study.text_file()
    if path is not None:
        if not path.exists():
            raise ProbeError(f"{here}: no file at '{path}' (relative to the study file).")
        if not path.is_file():
            raise ProbeError(f"{here}: '{path}' is not a file; give a UTF-8 text file.")
        try:
            with path.open("rb") as handle:
                head = handle.read(SNIFF)
            size = path.stat().st_size
        except OSError as exc:
            raise ProbeError(f"{here}: '{path}' cannot be read: {exc.strerror or exc}.") from None
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) == size)
        except UnicodeDecodeError as exc:
            raise ProbeError(
                f"{here}: '{path}' is not UTF-8 text (byte {head[exc.start]:#04x} at offset "
                f"{exc.start}); give a text file."
            ) from None
        if b"\x00" in head:
            raise ProbeError(f"{here}: '{path}' holds NUL bytes, so it is binary, not text.")
        if not head.strip():
            raise ProbeError(f"{here}: '{path}' is empty; give a file with some text in it.")
    else:
        size = default_corpus().stat().st_size
    t = study.text
    rows = t.batch_size * t.batches * (t.seeds + 1)
    tokens = rows * max(1, t.max_tokens - 2)  # at most two special tokens wrap each row
    if tokens > size:
        named = f"'{path}'" if path is not None else "the shipped corpus"
        raise ProbeError(
            f"{study.where} [text]: {counted(rows, 'row')} of {counted(t.max_tokens, 'token')} "
            "((seeds + 1) x batches "
            f"x batch_size = {t.seeds + 1} x {t.batches} x {t.batch_size}) need more text than "
            f"{named} holds ({counted(size, 'byte')}); lower seeds, batches, batch_size or "
            "max_tokens, or give a longer file."
        )


def check_threads(threads: int, what: str) -> None:
    """A torch thread count between 1 and this machine's CPU count."""
    if not 1 <= threads <= _cpus():
        raise ProbeError(
            f"{what} must be from 1 to {_cpus()} (this machine's CPU count), got {threads}."
        )


def check_model_fit(subject: Any) -> None:
    """What the study asks of its model, once the model is imported (a `subject.Subject`):
    rows and prompts within its position table, enough text for the rows, needle prompts only
    for a causal language model and buildable from the text, knock-outs smaller than half the
    heads. Run before the first step is computed, so nothing fails after minutes of work."""
    study = subject.study
    where, t, roles = study.where, study.text, study.roles
    objectives = ("causal-lm", "masked-lm", "embedding")
    if subject.objective not in objectives:
        raise ProbeError(
            f"{where} [model] source '{study.source}': objective '{subject.objective}' is not "
            f"one a head study scores. Available: {', '.join(objectives)}."
        )
    if subject.imported.tokenizer is None:
        raise ProbeError(
            f"{where} [model] source '{study.source}' has no tokenizer (tokenizer.json), so the "
            "text cannot be tokenized; give a model folder that has one."
        )
    limit = subject.model.cfg.max_positions
    fits = (("text", "max_tokens", t.max_tokens, t.max_tokens),
            ("roles", "period", roles.period, 2 * roles.period + 1 if roles.enabled else 0),
            ("roles", "context", roles.context, roles.context if roles.needles else 0))  # fmt: skip
    for section, name, value, tokens in fits:
        if limit is not None and tokens > limit:
            raise ProbeError(
                f"{where} [{section}] {name} = {value} makes inputs of {counted(tokens, 'token')}, "
                f"longer than this model's position table ({counted(limit, 'position')})."
            )
    need = t.batch_size * t.batches * (t.seeds + 1)
    try:
        rows = stream_rows(subject.docs, subject.imported.tokenizer, t.max_tokens, need)[0]
    except ProbeError as exc:
        raise ProbeError(f"{where} [text]: {exc}") from None
    if rows.shape[0] < need:
        raise ProbeError(
            f"{where} [text]: the text gives {counted(rows.shape[0], 'row')} of "
            f"{counted(t.max_tokens, 'token')} but "
            f"the study needs {need} ((seeds + 1) x batches x batch_size = {t.seeds + 1} x "
            f"{t.batches} x {t.batch_size}); lower seeds, batches, batch_size or max_tokens, or "
            "give a longer [text] file."
        )
    if roles.needles:
        off = "[roles] needles = 0 turns the needle prompts (and the knock-out) off"
        if subject.objective != "causal-lm":
            raise ProbeError(
                f"{where} [roles] needles: retrieval heads are measured on a causal language "
                f"model, and this one is scored by {subject.objective}; {off}."
            )
        try:
            subject.needles(1, seed=0)
        except ProbeError as exc:
            raise ProbeError(
                f"{where} [roles] needles = {roles.needles}, context = {roles.context}: "
                f"{str(exc).rstrip('.')}; {off}."
            ) from None
    _check_kv_fit(subject)
    _check_heal_fit(subject)
    n_heads = sum(len(h) for h in present_heads(subject.model))
    for k in study.knockout.heads:
        if 2 * k > n_heads:
            raise ProbeError(
                f"{where} [knockout] heads: {k} would leave fewer than {k} of the model's "
                f"{counted(n_heads, 'head')} to draw the random ones from; use at most "
                f"{n_heads // 2}."
            )


def _causal_within(subject: Any, section: str, needs: str, inputs: str, longest: int,
                   remove: str = "") -> None:  # fmt: skip
    """A study section that runs on a causal language model, with inputs of `longest` tokens
    within its positions: else one line naming the section ("[kv] makes inputs of ...")."""
    where = subject.study.where
    if subject.objective != "causal-lm":
        raise ProbeError(
            f"{where} [{section}]: {needs} a causal language model, and this one is scored by "
            f"{subject.objective}; remove the [{section}] section{f' {remove}' if remove else ''}."
        )
    limit = subject.model.cfg.max_positions
    if limit is not None and longest > limit:
        raise ProbeError(f"{where} [{section}] {inputs} longer than this model's position table "
                         f"({counted(limit, 'position')}).")  # fmt: skip


def _check_heal_fit(subject: Any) -> None:
    """Healing distills next-token distributions: a causal language model, rows within its
    positions."""
    study = subject.study
    heal, where = study.heal, study.where
    if not heal.methods:
        return
    _causal_within(subject, "heal", "healing distills next-token distributions, so it needs",
                   f"seq_len = {heal.seq_len} is", heal.seq_len, "(or its methods)")  # fmt: skip
    from probe.data.docs import docs_corpus

    cfg = heal.config()
    size = sum(len(d.encode()) + 1 for d in docs_corpus("train"))  # a token is a byte or more
    if cfg.steps * cfg.step_tokens > size:  # the step's own count comes after minutes of work
        raise ProbeError(
            f"{where} [heal] tokens = {heal.tokens:,} is more than the training pages of the "
            f"manuals corpus hold ({size:,} bytes, a token each at most); lower it."
        )


def _check_kv_fit(subject: Any) -> None:
    """Key/value plans need a decoder, prompts within its positions and text for the rows."""
    study = subject.study
    kv, where = study.kv, study.where
    if not kv.lengths:
        return
    longest = max(*kv.lengths, kv.loss_tokens, kv.score_context if "retrieval" in kv.methods
                  else 0)  # fmt: skip
    _causal_within(subject, "kv", "key/value-cache plans are measured on",
                   f"makes inputs of {counted(longest, 'token')},", longest)  # fmt: skip
    from probe.kv.needles import passkey_prompts
    from probe.measure.memory import check_fits, data_bytes, forward_bytes

    # before any prompt is made: the prompts and text rows held (~24 bytes a token), a prefill
    # of the longest, and razor's repeated sequences (8 rows a pass)
    cfg, dtype = subject.model.cfg, next(subject.model.parameters()).dtype
    held = 24 * kv.seeds * (kv.needles * sum(kv.lengths) + kv.loss_rows * kv.loss_tokens)
    razor = 2 * kv.razor_period + 1
    need = held + max(forward_bytes(cfg, 1, longest, dtype=dtype),
                      data_bytes(1, kv.razor_rows, razor) if "razor" in kv.methods else 0,
                      forward_bytes(cfg, min(kv.razor_rows, 8), razor, dtype=dtype)
                      if "razor" in kv.methods else 0)  # fmt: skip
    check_fits(need, f"{where} [kv] (prompts of up to {counted(longest, 'token')}, "
               f"{kv.seeds} x {kv.needles} needles per length)",
               "shorter lengths or loss_tokens, fewer needles, seeds or razor_rows, a shorter "
               "razor_period")  # fmt: skip
    try:
        passkey_prompts(subject.imported.tokenizer, 1, min(kv.lengths))
    except ProbeError as exc:
        raise ProbeError(f"{where} [kv] lengths: {exc}") from None
    need = kv.loss_rows * kv.seeds
    rows = stream_rows(subject.docs, subject.imported.tokenizer, kv.loss_tokens, need)[0]
    if rows.shape[0] < need:
        raise ProbeError(
            f"{where} [kv]: the text gives {counted(rows.shape[0], 'row')} of "
            f"{counted(kv.loss_tokens, 'token')} but loss_rows x seeds = {need} are needed; "
            "lower loss_rows, seeds or loss_tokens, or give a longer [text] file."
        )
