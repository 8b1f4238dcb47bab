"""The key/value-cache steps: each method's plans (which key/value heads keep the full cache,
`probe.kv.methods`) at each full-head share, measured by passkey accuracy at several lengths and
by loss on long text rows, with the cache's bytes (`probe.kv.sweep`); the report's section on
what the plans save and the answer's sentence on them (here), its claims against published work
(`probe.study.heads.kv_claims`).

Beside the methods, every run measures the baselines: `full` (every head keeps the whole cache),
`streaming` (every head keeps sink + window: StreamingLLM), `window` (every head keeps only the
window, no sink: the window attention StreamingLLM starts from) and `streaming` at the memory of
each share (every head's window widened until the cache holds as many bytes as the share's plan at
that length: the baseline "at the same memory").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, make_dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from probe.errors import ProbeError
from probe.kv.methods import METHODS, head_methods
from probe.kv.plan import PREFILLS, KVPlan
from probe.options import option
from probe.study.heads import kv_claims
from probe.study.heads.kv_report import kv_answer, plans_section
from probe.study.heads.step import Claim, Options, Section, StepKind, StudySection
from probe.study.heads.study import HeadStudy
from probe.words import counted

if TYPE_CHECKING:
    from probe.study.heads.subject import Subject

KV_BASELINES = ("full", "streaming", "window")  # measured beside every [kv] section's methods


@dataclass(frozen=True)
class _Common:
    # key/value-cache plans (probe.kv): heads chosen by each method keep the full cache, the rest
    # stream (sink + window); "full" and "streaming" are measured beside them. No lengths: off.
    methods: tuple[str, ...] = ()  # retrieval, razor, duo, random
    full_shares: tuple[float, ...] = option(
        (), low=0, high=1, help="shares of key/value heads keeping the full cache"
    )
    sink: int = option(4, low=0, high=2**40, help="first tokens a streaming head keeps")
    window: int = option(64, low=1, high=2**40, help="recent tokens a streaming head keeps")
    lengths: tuple[int, ...] = option((), low=64, help="tokens per passkey prompt")
    # passkey prompts per length and seed (depths spread over the haystack)
    needles: int = option(3, low=1, help="passkey prompts per length and seed")
    # seeds of passkeys, haystacks and text rows (and of the random plans)
    seeds: int = option(3, low=1, help="seeds of prompts, text rows and random plans")
    loss_tokens: int = option(1024, low=16, help="tokens per text row scored by loss")
    loss_rows: int = option(2, low=1, help="text rows per seed")
    # how a passkey prompt enters a plan's cache (probe.kv.plan.PREFILLS): the papers' full
    # prefill then the cut, chunked (cut after each chunk) or masked (cut at every position)
    prefill: str = option("full", help="full, chunked or masked: how a prompt enters the cache")
    prefill_chunk: int = option(1024, low=1, help="tokens per call of the chunked prefill")


# the [kv] section: the fields above, then each method's declared options under its prefix
# (retrieval's score_needles, razor's razor_period, duo's duo_steps ...), in the methods' order
def _method_fields() -> list[tuple[str, Any, Any]]:
    """Every method's options as [kv] fields; a key two methods make, or one the section has
    already, is refused naming both."""
    taken = {f.name: "the [kv] section" for f in dataclasses.fields(_Common)}
    fields = []
    for method in METHODS:
        for key, tp, field in method.study_fields():
            if key in taken:
                raise ProbeError(f"the {method.name} method's [kv] key '{key}' is taken by "
                                 f"{taken[key]}; give it another study_prefix.")  # fmt: skip
            taken[key] = f"the {method.name} method"
            fields.append((key, tp, field))
    return fields


# built once, from the methods of probe.kv.methods (a method added later, as a test's toy is,
# plans and runs from Python and the command line but has no [kv] keys)
KVOptions = make_dataclass("KVOptions", _method_fields(), bases=(_Common,), frozen=True)
KVOptions.__module__ = __name__  # where pickle finds it


def _check(study: HeadStudy) -> None:
    """Plans need lengths to be measured at, and shares above 0 (0 is streaming, always run)."""
    where, kv = study.where, study.kv
    if (kv.methods or kv.full_shares) and not kv.lengths:
        raise ProbeError(f"{where} [kv] needs lengths (passkey prompt lengths in tokens) to "
                         "measure its plans.")  # fmt: skip
    if 0 in kv.full_shares:
        raise ProbeError(f"{where} [kv] full_shares: 0 is the streaming-only cache, measured in "
                         "every run; list shares above 0.")  # fmt: skip
    if kv.prefill not in PREFILLS:
        raise ProbeError(f"{where} [kv] prefill must be one of {', '.join(PREFILLS)}, got "
                         f"{kv.prefill!r}.")  # fmt: skip
    if kv.methods and not kv.full_shares:
        raise ProbeError(f"{where} [kv] methods need full_shares (the shares of key/value heads "
                         "that keep the full cache, e.g. [0.1, 0.25]).")  # fmt: skip
    for name in kv.methods:  # the plan fields a method's options set (razor's buffer_ratio)
        how = METHODS.get(name)
        extra = how.extra_fields(how.read(how.study_options(kv)))
        try:
            KVPlan(name, 0.0, kv.sink, kv.window, (), **extra)
        except ProbeError as exc:
            raise ProbeError(f"{where} [kv] {name} ({_named(how)}): {exc}") from None


def _named(how) -> str:
    """A method's [kv] keys, for a message ("razor_period, razor_rows, ...")."""
    return ", ".join(how.study_keys().values())


def _fit(subject: Subject) -> None:
    """Key/value plans need a decoder, prompts within its positions and text for the rows."""
    from probe.data.text import stream_rows
    from probe.kv.needles import passkey_prompts
    from probe.measure.memory import check_fits, data_bytes, forward_bytes
    from probe.study.heads.checks import causal_within

    study = subject.study
    kv, where = study.kv, study.where
    if not kv.lengths:
        return
    longest = max(*kv.lengths, kv.loss_tokens, kv.score_context if "retrieval" in kv.methods
                  else 0)  # fmt: skip
    causal_within(subject, "kv", "key/value-cache plans are measured on",
                  f"makes inputs of {counted(longest, 'token')},", longest)  # fmt: skip
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
    for name in kv.methods:  # each method's options against this model (razor's ratios)
        how = METHODS.get(name)
        keys = how.study_keys()
        try:
            how.check_fits(cfg, how.read(how.study_options(kv)), lambda f, k=keys: f"[kv] {k[f]}")
        except ProbeError as exc:
            raise ProbeError(f"{where} {exc}") from None
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


KV = StudySection("kv", 50, KVOptions, check=_check, fit=_fit, methods=head_methods,
                  listed=lambda o: (*o.methods, *KV_BASELINES) if o.lengths else ())  # fmt: skip


def matched_window(share: float, length: int, sink: int, window: int) -> int:
    """The window a streaming head needs so that every head streaming holds as many tokens of a
    `length`-token input as a plan with `share` full heads (the rest sink + window)."""
    held = share * length + (1 - share) * min(length, sink + window)
    return max(window, round(held) - sink)


def _scoring(study: HeadStudy, method: str) -> Options:
    """The options a method's head scores depend on (hashed with each of its steps): its
    declared options, under their [kv] keys (razor's period: razor_period)."""
    return {key: getattr(study.kv, key) for key in METHODS.get(method).study_keys().values()}


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    kv = study.kv
    if not kv.lengths:
        return []
    common = {"sink": kv.sink, "window": kv.window, "lengths": list(kv.lengths),
              "needles": kv.needles, "seeds": kv.seeds, "loss_tokens": kv.loss_tokens,
              "loss_rows": kv.loss_rows, "prefill": kv.prefill}  # fmt: skip
    if kv.prefill == "chunked":  # the chunk matters only there
        common["prefill_chunk"] = kv.prefill_chunk
    steps = [("kv-full", {**common, "method": "full", "full_share": 1.0}),
             ("kv-streaming", {**common, "method": "streaming", "full_share": 0.0}),
             ("kv-window", {**common, "method": "window", "full_share": 0.0})]  # fmt: skip
    for share in kv.full_shares:
        for method in kv.methods:
            steps.append((f"kv-{method}-{share:g}", {**common, "method": method,
                                                      "full_share": share,
                                                      **_scoring(study, method)}))  # fmt: skip
        matched = {**common, "method": "streaming", "full_share": share, "matched": True}
        steps.append((f"kv-streaming-{share:g}", matched))
    return steps


def _scores(subject: Subject, options: Options) -> tuple[pd.DataFrame, dict]:
    """A method's key/value-head scores and the notes on what they rest on, computed once per
    process (every share reuses them)."""
    method = options["method"]
    scoring = _scoring(subject.study, method)
    key = ("kv-scores", method, json.dumps(scoring, sort_keys=True))
    if key not in subject.memo:
        from probe.kv.planning import make_plan

        kv, how = subject.study.kv, METHODS.get(method)
        given = how.read(how.study_options(kv))
        prompts = None
        if how.prompts is not None:  # it reads text: the study's
            prompts = how.prompts(subject.docs, subject.imported.tokenizer, given, 0)
        try:
            result = make_plan(subject.model, method, 1.0, kv.sink, kv.window, options=given,
                               seed=0, prompts=prompts)  # fmt: skip
        except ProbeError as exc:
            if how.prompts is None:
                raise
            named = ", ".join(f"{k} = {v}" for k, v in scoring.items())
            raise ProbeError(f"{subject.study.where} [kv] {method} ({named}): {exc}") from None
        subject.memo[key] = (result.scores, result.notes)
    return subject.memo[key]


def kv(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """One method at one full-head share (or a baseline): rows of `probe.kv.sweep.COLUMNS`."""
    from probe.data.text import text_batches
    from probe.kv.evaluate import Prefill, Prefills, prefill_budget
    from probe.kv.planning import full_count, make_plan, scored_plan
    from probe.kv.sweep import measure_plan

    model, tokenizer = subject.model, subject.imported.tokenizer
    method, share = options["method"], float(options["full_share"])
    sink, window = int(options["sink"]), int(options["window"])
    seeds, rows = int(options["seeds"]), int(options["loss_rows"])
    text = text_batches(subject.docs, tokenizer, "causal-lm", int(options["loss_tokens"]), rows,
                        seeds)  # fmt: skip

    heads = sum(len(s.kept_groups) for s in model.cfg.sites())
    kept = full_count(share, heads) / heads  # the share a plan really keeps (rounded heads)

    def plans(seed: int, length: int) -> KVPlan:
        if method in ("full", "streaming", "window"):
            kind = "full" if method == "full" else "streaming"
            s = 0 if method == "window" else sink
            w = matched_window(kept, length, sink, window) if options.get("matched") else window
            return make_plan(model, kind, 0.0, s, w).plan
        how = METHODS.get(method)
        given = how.study_options(subject.study.kv)
        if how.per_seed:  # a draw: again for each seed
            return make_plan(model, method, share, sink, window, options=given, seed=seed).plan
        return scored_plan(method, _scores(subject, options)[0], model.cfg, share, sink,
                           window, given)  # fmt: skip

    prefill = Prefill(options.get("prefill", "masked"), int(options.get("prefill_chunk", 1024)))
    # the full prefill is the same for every plan: kept across this process's steps
    device = next(model.parameters()).device
    store = subject.memo.setdefault("kv-prefills", Prefills(prefill_budget(device)))
    table = measure_plan(model, tokenizer, method, share, plans, options["lengths"], seeds,
                         int(options["needles"]), text, progress, prefill, store)  # fmt: skip
    how = METHODS.find(method)
    if how is not None and how.scores is not None and not how.per_seed:
        table.attrs["notes"] = _scores(subject, options)[1]  # recorded in the step's done.json
    return table


DECLARES = StepKind(
    "kv", 8, kv, _plan, section=KV, reports=(Section("kv", 75, plans_section),),
    answer=kv_answer,
    claims=(Claim("xiao2025-duo", 60, kv_claims.duo, ("xiao2025-duo",)),
            Claim("tang2024-razor", 70, kv_claims.razor, ("tang2024-razor",)),
            Claim("xiao2023-sinks", 80, kv_claims.streaming, ("xiao2023",))),
)  # fmt: skip
