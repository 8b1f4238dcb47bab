"""A head study's comparison with published work: one verdict per claim, from evidence.

Each claim is checked only in its published direction, with the study's own interval (the range
over seeds of disjoint text) or test, and the verdict is "agrees", "disagrees" or "inconclusive"
with the numbers that decide it. A setting that differs from the paper's (model size, task,
criterion) is said next to the verdict. Each claim is declared by the step kind whose tables it
reads (`heads/steps/`); the report gathers them in their order (`report.comparison`).
"""

from __future__ import annotations

import pandas as pd

from probe.references import published
from probe.significance import ALPHA
from probe.study.heads import evidence as ev
from probe.study.heads.findings import Findings
from probe.study.verdicts.contrast import smallest_p
from probe.study.verdicts.stats import fmt_vs
from probe.words import counted


def _verdict(all_above: bool, none_above: bool) -> str:
    return "agrees" if all_above else ("disagrees" if none_above else "inconclusive")


def michel(report: Findings) -> str | None:
    best = report.best()
    if best is None:
        return None
    ref = published("michel2019")
    low = min(v.value for v in ref.values if "prunable" in v.what)
    verdict = _verdict(best.min_fraction >= low, best.max_fraction < low)
    versus = ev.against_random(report.curves, report.objective)
    theirs = "gradient" if "gradient" in set(versus.get("method", [])) else best.method
    if not versus.empty:  # (empty, without columns, when no curve removes random heads)
        versus = versus[(versus.method == theirs) & (versus.unit == "head")]
    row = versus
    beat = ""
    if not row.empty:
        r = row.iloc[0]
        beat = (f" Heads ranked by {theirs} against random ones: mean {r.metric} {r['mean']:.4g} "
                f"against "
                f"{r.random_mean:.4g} over the first half of the curve, one-sided p = "
                f"{fmt_vs(r.p_value, ALPHA, 3)} ({'a' if r.p_value <= ALPHA else 'no'} "
                f"significant difference at {ALPHA}; the smallest p {int(r.n)} against "
                f"{counted(int(r.n_random), 'seed')} allow is "
                f"{smallest_p(int(r.n), int(r.n_random)):.3f}).")  # fmt: skip
    loose = ev.operating_summary(report.curves, report.objective, 10 * report.tolerance,
                                 report.n_heads)  # fmt: skip
    loose = loose[(loose.method == best.method) & (loose.unit == best.unit)].iloc[0]
    looser = (f" At ten times the tolerance {best.method} removes "
              f"{ev.share_range(loose.min_fraction, loose.max_fraction)}.")  # fmt: skip
    return (
        f"**{ref.short}** ({ref.claim_source}): many heads can be removed without noticeable "
        f"loss (their smallest figure: {ev.pct(low)} of heads). Here {best.method} removes "
        f"{ev.share_range(best.min_fraction, best.max_fraction)} across seeds with "
        f"{report.criterion()}: **{verdict}** in direction (every seed at or above "
        f"{ev.pct(low)} is required to agree, none to disagree; the criterion differs from the "
        f"paper's task accuracy).{looser}{beat}"
    )


def kwon(report: Findings) -> str | None:
    """What the abstract says, quoted; the one part of it this study can test (mask tuning, the
    technique that "reconstructs the output activations for each layer", lowers the loss the
    Fisher mask costs), tested like with like: the same Fisher mask with and without Kwon et
    al.'s layer-by-layer tuning; and what is not comparable, said so."""
    rec = ev.tuning_recovery(report.curves) if not report.curves.empty else pd.DataFrame()
    if rec.empty:
        return None
    ref = published("kwon2022")
    quoted = (f"**{ref.short}** ({ref.claim_source}) name {ref.quotes['tuning']!r} as one of "
              f"three techniques and report for the whole framework: "
              f"{ref.quotes['framework']!r}.")  # fmt: skip
    apart = (" Not comparable: that figure is for the whole framework (Fisher search, mask "
             "rearrangement and tuning, over heads and FFN filters) on fine-tuned BERT-base and "
             "DistilBERT scored by GLUE and SQuAD accuracy under a FLOPs budget; here only heads "
             "of a pretrained language model are removed, without rearrangement, scored by "
             "next-token loss, so no accuracy or FLOPs number here is set against it.")  # fmt: skip
    part = rec[(rec.fraction <= 0.5) & (rec.increase_untuned > 0)].dropna()
    if part.empty:
        return (f"{quoted} Here the untuned Fisher mask never raised the loss up to half the "
                f"heads, so there was nothing for tuning to recover.{apart}")  # fmt: skip
    helped = int((part.increase_tuned < part.increase_untuned).sum())
    verdict = _verdict(helped == len(part), helped == 0)
    lo, hi = float(part.recovered.min()), float(part.recovered.max())
    return (
        f"{quoted} Comparable: whether the tuning lowers the loss increase of the same Fisher "
        f"mask. Here it does in {helped} of {len(part)} seed-and-fraction points up to half the "
        f"heads where the untuned mask raises the loss (tuning recovers {ev.pct(lo)} to "
        f"{ev.pct(hi)} of the increase): **{verdict}** (lower in every point is required to "
        f"agree, in none to disagree).{apart}"
    )


def he(report: Findings) -> str | None:
    c = report.curves
    if c.empty or "attention-layer" not in set(c.method):
        return None
    ref = published("he2024")
    loss = c[(c.method == "attention-layer") & (c.metric == "loss")]
    base = loss[loss.n_pruned == 0].groupby("seed").value.first()
    half = loss[(loss.fraction - 0.5).abs() < 0.02]
    if half.empty:
        return None
    rise = half.value.to_numpy() - half.seed.map(base).to_numpy()
    verdict = _verdict(
        bool((rise <= report.tolerance).all()), bool((rise > report.tolerance).all())
    )
    return (
        f"**{ref.short}** ({ref.claim_source}): half of the attention layers of Llama-2-70B "
        f"can be dropped for a small loss (average accuracy 73.9 to 71.5). Here dropping half of "
        f"the attention sub-layers raises the loss by {fmt_vs(rise.min(), report.tolerance, 3)} "
        f"to {fmt_vs(rise.max(), report.tolerance, 3)} nats "
        f"across seeds: **{verdict}** at this scale (within +{report.tolerance:g} nats in every "
        "seed is required to agree). The paper also finds that smaller models tolerate less "
        "(Llama-2-13B: 68.2 to 64.9 with half its layers dropped)."
    )


def wu(report: Findings) -> list[str]:
    from probe.analysis.roles import ROLE_THRESHOLDS, has_role

    out = []
    ref = published("wu2024")
    retrieval = report.tables.get("retrieval")
    if retrieval is not None and len(retrieval):
        threshold = ROLE_THRESHOLDS["retrieval"].value
        n = int(has_role("retrieval", retrieval.value).sum())
        needles = int(report.study["roles"]["needles"])
        if "prompts" in retrieval.columns:
            basis = (f"by the paper's score (greedy decoding of as many tokens as the needle "
                     "has, where the authors' code decodes up to 50; hits over the needle length; "
                     f"the model retrieved {int(retrieval.prompts.iloc[0])} of the {needles} "
                     "needles, and only those count)")  # fmt: skip
        else:
            basis = "by the teacher-forced variant of the score (an earlier run: rerun it)"
        out.append(
            f"**{ref.short}** ({ref.claim_source}): retrieval heads are few (about 3% to 6% of "
            f"heads score above 0.1 in models of 6B to 46B parameters). Here {n} of "
            f"{report.n_heads} heads ({100 * n / report.n_heads:.1f}%) score above "
            f"{threshold:g} {basis}, on {needles} needle prompts of "
            f"{counted(int(report.study['roles']['context']), 'token')} (the paper: about "
            "600 prompts of 1K to 50K tokens); a count, not a test."
        )
    knockout = report.tables.get("knockout")
    if knockout is not None and len(knockout):
        greedy = "recall" in knockout.columns  # the paper's measure: the output's needle recall
        metric = "recall" if greedy else "copy_accuracy"
        what = ("needle recall of the greedy output (the paper's measure)" if greedy
                else "teacher-forced copy accuracy")  # fmt: skip
        test = ev.knockout_test(knockout, metric)
        top = test.iloc[-1]
        all_sig = bool((test.p_value <= ALPHA).all())
        none_sig = bool((test.retrieval_heads >= test.random_median).all())
        verdict = _verdict(all_sig, none_sig)
        out.append(
            f"**{ref.short}**: masking the retrieval heads breaks retrieval while masking random "
            f"heads does not. Here masking the top {int(top.k)} retrieval heads moves the "
            f"{what} from {top.unmasked:.2f} to {top.retrieval_heads:.2f}, against "
            f"{top.random_min:.2f} to {top.random_max:.2f} for "
            f"{counted(int(top.draws), 'draw')} of as many "
            f"random heads (p = {fmt_vs(top.p_value, ALPHA, 3)}); over k = "
            f"{', '.join(str(int(k)) for k in test.k)}: **{verdict}** (p <= {ALPHA} at every k "
            "is required to agree; retrieval heads no worse than the median random draw at every "
            "k to disagree)."
        )
    return out


def xiao(report: Findings) -> str | None:
    roles = report.tables.get("roles")
    if roles is None or "sink" not in set(roles.statistic):
        return None
    from probe.analysis.roles import has_role

    ref = published("xiao2023")
    sinks = roles[(roles.statistic == "sink") & has_role("sink", roles.value)]
    layers = sorted(sinks.layer.unique())
    share_low = len(sinks[sinks.layer < 2]) / max(len(sinks), 1)
    return (
        f"**{ref.short}** ({ref.claim_source}): many heads put a large share of their attention "
        f"on the first token, beyond the bottom two layers. Here {len(sinks)} of "
        f"{report.n_heads} heads put at least half of it there, in layers "
        f"{', '.join(str(x) for x in layers) or 'none'} ({ev.pct(share_low)} of them in layers 0 "
        "and 1); a description, not a test."
    )
