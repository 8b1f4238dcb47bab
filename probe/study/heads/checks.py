"""What a head study file may say that is no one section's, checked when it is loaded (by `probe
study validate` and at the start of `probe study run`, before anything is computed): the model
source (an installed bundled model, a Hugging Face folder or a GGUF file), the text file (a UTF-8
text file with enough text for the rows the study asks for), the thread count, and once the model
is imported, what the rows of text ask of it. Types are checked by `from_dict`, the range of every
number by its section's options (`probe.options`), the rest of a section by the step module that
declares it (`heads/steps/`). Every error is one line naming the file, the section, the field and
what was expected.
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
from probe.study.documents import read_json
from probe.study.heads.study import HeadStudy
from probe.words import counted

GGUF_MAGIC = b"GGUF"
SNIFF = 1 << 16  # bytes of a text file read to tell text from binary


def _cpus() -> int:
    return os.cpu_count() or 1


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
    """What the study asks of its model that is no one section's, once the model is imported
    (a `subject.Subject`): a study's objective and a tokenizer, rows within its position table
    and enough text for them. Each section checks its own next (`steps.check_fit`)."""
    study = subject.study
    where, t = study.where, study.text
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
    within(subject, "text", "max_tokens", t.max_tokens, t.max_tokens)
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


def within(subject: Any, section: str, name: str, value: int, tokens: int) -> None:
    """A field whose `value` makes inputs of `tokens` tokens, within the model's position table:
    else one line naming it ("[roles] context = 2000 makes inputs of ...")."""
    limit = subject.model.cfg.max_positions
    if limit is not None and tokens > limit:
        raise ProbeError(
            f"{subject.study.where} [{section}] {name} = {value} makes inputs of "
            f"{counted(tokens, 'token')}, longer than this model's position table "
            f"({counted(limit, 'position')})."
        )


def causal_within(subject: Any, section: str, needs: str, inputs: str, longest: int,
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
