"""A KV-cache study against published work: DuoAttention's and RazorAttention's memory savings
at (near) full accuracy, and StreamingLLM's attention sinks, each checked in its published
direction from the study's `kv` table (`probe.kv.summary`), with the verdict "agrees",
"disagrees" or "inconclusive" and the numbers that decide it.

The savings rule is the study's target rule: a plan "keeps the accuracy" when its needle accuracy
is at least `KEPT` of the full cache's at every length (point estimates over the seeds' prompts);
a paper's saving is reached ("agrees") when such a plan saves at least as much of the cache at
every length and retrieves no significantly fewer whole keys than the full cache at any length
(the worst length's counts and the plan's interval shown). "Disagrees" needs a test: every
share saving that much retrieves fewer whole keys than the full cache at some length, one-sided
Fisher exact p <= ALPHA (the counts are shown).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from scipy import stats

from probe.kv.summary import KEPT, clopper_pearson
from probe.references import published
from probe.significance import ALPHA
from probe.study.heads.findings import Findings
from probe.study.verdicts.contrast import Contrast, evaluate
from probe.study.verdicts.expect import Condition
from probe.words import counted

MARGIN = 0.10  # a share "about" a paper's saving saves at most this much more


def _kv(report: Findings) -> pd.DataFrame | None:
    kv = report.tables.get("kv")
    return None if kv is None or kv.empty else kv


def _below_full(table: pd.DataFrame, method: str, share: float) -> tuple[float, str]:
    """The smallest one-sided Fisher p (plan's exact keys below the full cache's) over the
    lengths, and the counts at that length."""
    needles = table[table.prompts.notna()]
    full = needles[needles.method == "full"].set_index("length")
    plan = needles[(needles.method == method) & (needles.full_share == share)]
    best = (1.0, "")
    for r in plan.itertuples():
        f = full.loc[r.length]
        a, n, b, m = int(r.exact), int(r.prompts), int(f.exact), int(f.prompts)
        p = float(stats.fisher_exact([[a, n - a], [b, m - b]], alternative="less")[1])
        if p <= best[0]:
            low, high = clopper_pearson(a, n)
            best = (p, f"{a}/{n} keys against the full cache's {b}/{m} at {r.length:,} tokens "
                       f"(the plan's rate {low:.2f}-{high:.2f}, 95% interval)")  # fmt: skip
    return best


def _saving(report: Findings, method: str, ref_id: str, need: float, what: str,
            differences: str) -> str | None:  # fmt: skip
    """Agrees when a share saving `need` keeps the accuracy (the target's point rule) and
    retrieves no significantly fewer whole keys than the full cache at any length (one-sided
    Fisher exact test, p > ALPHA; its worst length is shown with the plan's interval, so the
    reader sees how large a loss the prompts could miss); disagrees when a share saving no more
    than `need` + MARGIN (about the paper's saving, or less) retrieves significantly fewer whole
    keys than the full cache at some length (one-sided Fisher exact test on the prompts pooled
    over seeds, p <= ALPHA); inconclusive otherwise, also when no share measured saves as little
    as that (a plan saving far more than a paper claims failing says nothing against it)."""
    if report.kv is None:
        return None
    table, rows = report.kv
    if rows.empty or method not in set(rows.method):
        return None
    ref = published(ref_id)
    rows = rows[rows.method == method]
    kept = rows[rows.kept_min >= KEPT]
    near = rows[rows.saved_min <= need + MARGIN]
    tested = {r.full_share: _below_full(table, method, r.full_share) for r in near.itertuples()}
    top = kept.sort_values("saved_min").iloc[-1] if not kept.empty else None
    worst = _below_full(table, method, top.full_share) if top is not None else (1.0, "")
    if top is not None and float(top.saved_min) >= need and worst[0] > ALPHA:
        verdict = "agrees"
    elif any(p <= ALPHA for p, _ in tested.values()):
        verdict = "disagrees"
    else:
        verdict = "inconclusive"
    if top is None:
        best = "no share keeps it"
    else:
        best = (f"the most any share saves while keeping it is {top.saved_min:.0%} "
                f"({1 / (1 - top.saved_min):.2f}x less memory; {int(top.full_heads)} key/value "
                f"heads full)")  # fmt: skip
    if top is not None and float(top.saved_min) >= need:  # the share that kept it says it
        at_need = (f"; at its worst length it retrieves {worst[1]}, one-sided Fisher p = "
                   f"{worst[0]:.2g} for fewer")  # fmt: skip
    elif tested:
        share, (p, counts) = min(tested.items(), key=lambda kv_: kv_[1][0])
        row = rows[rows.full_share == share].iloc[0]
        at_need = (f"; at share {share:g}, which saves {row.saved_min:.0%} (no more than "
                   f"{need + MARGIN:.0%}), it retrieves {counts} (one-sided Fisher p = "
                   f"{p:.2g})")  # fmt: skip
    else:
        least = float(rows.saved_min.min())
        at_need = (f"; the least any measured share saves is {least:.0%}, far more than the "
                   f"paper's {need:.0%}, so this does not test its figure")  # fmt: skip
    return (f"**{ref.short}** ({ref.claim_source}): {what}. Here, with at least {KEPT:.0%} of "
            f"the full cache's needle accuracy at every length, {best}{at_need}: **{verdict}**. "
            f"Differences: {differences}")  # fmt: skip


def duo(report: Findings) -> str | None:
    gqa = int(report.facts.n_kv_head) < int(report.facts.n_head)
    ref = published("xiao2025-duo")
    factor = next(v.value for v in ref.values if ("GQA" if gqa else "MHA") in v.what)
    o = report.study.get("kv", {})
    return _saving(
        report, "duo", "xiao2025-duo", 1 - 1 / factor,
        f"keeping the full cache only for the heads its trained gates pick reduces memory by up "
        f"to {factor:g}x for {'GQA' if gqa else 'MHA'} models ({1 - 1 / factor:.0%} saved) with "
        "minimal accuracy loss",
        f"{_training(report)}; deployed with {o.get('sink')} sink tokens and a "
        f"{o.get('window')}-token window (the reference: 64 and 256); {_protocol(o)}; a "
        f"{int(report.facts.parameters) / 1e6:.0f}M-parameter model at {_lengths(report)} "
        "tokens; memory counted as the KV cache alone.",
    )  # fmt: skip


def _training(report: Findings) -> str:
    """How the gates were trained, from a duo step's notes (the reference: 2,000 steps on
    passkeys in 1,000-32,000 tokens of text, sink 128, window 256)."""
    notes = next((n for n in map(_notes, sorted((report.out / "steps").glob("kv-duo-*")))
                  if n), None)  # fmt: skip
    if notes is None:
        return "gates trained on a CPU for far fewer steps than the reference's 2,000"
    words = ("passkeys in text" if notes.get("duo_prompts") == "passkeys in text"
             else "random-token passkeys")  # fmt: skip
    total = report.n_heads // (int(report.facts.n_head) // int(report.facts.n_kv_head))
    return (f"gates trained for {notes['duo_steps_run']} steps on {words} of "
            f"{int(notes['duo_prompt_tokens']):,} tokens (the reference: 2,000 steps on passkeys "
            f"in 1,000-32,000 tokens of text), with sink {notes['duo_train_sink']} and window "
            f"{notes['duo_train_window']} (the reference: 128 and 256), leaving "
            f"{notes['duo_undecided']} of {total} gates undecided between 0.05 and 0.95 (median "
            f"{notes['duo_gate_median']:.2f})")  # fmt: skip


def _notes(step: Path) -> dict | None:
    try:
        return json.loads((step / "done.json").read_text(encoding="utf-8")).get("notes")
    except (OSError, ValueError):
        return None


def razor(report: Findings) -> str | None:
    ref = published("tang2024-razor")
    need = ref.values[0].value
    o = report.study.get("kv", {})
    ratio = float(o.get("razor_buffer_ratio", 0.0))
    buffer = (f"the other heads' buffer max({o.get('window')}, N/{ratio:g}) recent tokens with "
              f"{o.get('sink')} sink tokens" if ratio else
              f"the other heads keeping a fixed {o.get('window')}-token window and "
              f"{o.get('sink')} sink tokens (the paper's buffer grows with the input, "
              "max(S0, N/C), so it keeps more)")  # fmt: skip
    token = ("dropped keys folded into a compensation token" if o.get("razor_compensate")
             else "no compensation token for the dropped keys")  # fmt: skip
    return _saving(
        report, "razor", "tang2024-razor", need,
        f"keeping the full cache only for echo and induction heads removes over {need:.0%} of "
        "it without noticeable impact",
        f"{_ranking(o)}, scored on {o.get('razor_rows')} sequences of "
        f"{o.get('razor_period')} random tokens repeated twice; {buffer}; {token}; "
        f"{_protocol(o)}; a {int(report.facts.parameters) / 1e6:.0f}M-parameter model at "
        f"{_lengths(report)} tokens.",
    )  # fmt: skip


def _ranking(o: dict) -> str:
    """How razor ranked heads (before the published rule, by the larger of the two scores)."""
    if "razor_induction_ratio" not in o:
        return "heads ranked by the larger of their echo and induction scores (not apart)"
    ratios = (float(o["razor_induction_ratio"]), float(o.get("razor_echo_ratio", 0.0)))
    split = ("the paper's 14:1 proportion" if ratios == (0.14, 0.01) else
             f"the proportion {ratios[0]:g}:{ratios[1]:g}, the paper's 0.14:0.01")  # fmt: skip
    return (f"induction and echo heads ranked apart at the study's shares (in {split}, not at "
            "its fixed 14% + 1%)")  # fmt: skip


def _protocol(o: dict) -> str:
    """The prefill the plans were measured with, against the papers' (full, then the cut)."""
    mode = o.get("prefill", "masked")
    if mode == "full":
        return "prompts prefilled with full attention and then cut, as the paper does"
    if mode == "chunked":
        return f"prompts prefilled in chunks of {int(o.get('prefill_chunk', 1024)):,} tokens"
    return (
        "prompts prefilled with the streaming heads already cut at every position (the "
        "paper prefills with full attention and cuts after)"
    )


def _lengths(report: Findings) -> str:
    kv = _kv(report)
    lengths = sorted(kv[kv.metric != "loss"].length.unique()) if kv is not None else []
    return ", ".join(f"{n:,}" for n in lengths)


def streaming(report: Findings) -> str | None:
    kv = _kv(report)
    if kv is None or not {"streaming", "window"} <= set(kv.method):
        return None
    ref = published("xiao2023")
    loss = kv[(kv.metric == "loss") & (kv.full_share == 0)]
    full = kv[(kv.metric == "loss") & (kv.method == "full")].value.mean()
    if not {"streaming", "window"} <= set(loss.method):
        return None
    # the contrasts' own test: per seed, sink + window against window alone
    claim = Contrast("sink tokens lower window attention's loss", "kv", "loss", "streaming",
                     "window", column="method", expect="lower",
                     where=(Condition("full_share", "==", 0.0),), paired=("seed",))  # fmt: skip
    test = evaluate(claim, kv).iloc[0]
    sink, window = test.mean_a, test.mean_b
    verdict = {"supported": "agrees", "contradicted: the opposite direction": "disagrees"}.get(
        test.verdict, "inconclusive")  # fmt: skip
    o = report.study.get("kv", {})
    return (
        f"**{ref.short}** ({ref.claim_source}): keeping {o.get('sink')} initial tokens beside "
        "the recent window restores window attention's perplexity. Here, on text rows of "
        f"{int(loss.length.iloc[0]):,} tokens with a {o.get('window')}-token window, the loss is "
        f"{sink:.3f} nats with the sink tokens against {window:.3f} without "
        f"(full cache {full:.3f}; one-sided sign-flip test over "
        f"{counted(int(test.n_pairs), 'seed')} paired by their text rows, p = "
        f"{test.p_claim:.2g}): **{verdict}** in direction"
        + (
            f"; the sink tokens close {(window - sink) / (window - full):.0%} of the gap to the "
            "full cache."
            if window > full
            else "."
        )
    )
