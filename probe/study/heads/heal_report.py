"""What a healing study's report says (the `heal` table of `steps/heal.py`): held-out perplexity
against the tokens distilled, per pruning method with the seeds' range; the share of the
perplexity increase each method's healing wins back, with a t-interval over seeds; the target
(at least half of the increase won back for the best pruned model) and the comparison with
Minitron's claim (Muralidharan et al. 2024); and the answer's sentence.

The share won back by a run is (pruned - healed) / (pruned - original), perplexities on the same
held-out tokens, healed at the largest token count measured. The target is met when the lower end
of the 95% t-interval over seeds is at least TARGET, missed when its upper end is below, and
undecided otherwise (one seed: no interval, so never decided).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
from scipy import stats

from probe.interop.llama_cpp import speed_summary
from probe.references import published
from probe.study.heads.findings import Findings
from probe.words import counted

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport

TARGET = 0.5  # share of the perplexity increase healing should win back


def heal_table(r: Findings) -> pd.DataFrame | None:
    heal = r.tables.get("heal")
    return None if heal is None or heal.empty else heal


def recovery(heal: pd.DataFrame) -> pd.DataFrame:
    """Per method: heads kept, perplexity original / pruned / healed (at the largest tokens,
    mean over seeds), the share won back per seed, its mean and 95% t-interval, the verdict."""
    ppl = heal[heal.metric == "perplexity"]
    rows = []
    for method, part in ppl.groupby("method", sort=False):
        original = float(part[part.stage == "original"].value.mean())
        pruned = float(part[part.stage == "pruned"].value.mean())
        healed = part[part.stage == "healed"]
        tokens = int(healed.tokens.max()) if len(healed) else 0
        last = healed[healed.tokens == tokens].sort_values("seed")
        shares = [(pruned - v) / (pruned - original) if pruned > original else float("nan")
                  for v in last.value]  # fmt: skip
        n = len(shares)
        mean = sum(shares) / n if n else float("nan")
        low = high = float("nan")
        if n >= 2:
            sd = pd.Series(shares).std(ddof=1)
            half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
            low, high = mean - half, mean + half
        verdict = "met" if low >= TARGET else "missed" if high < TARGET else "undecided"
        first = part[part.stage == "pruned"].iloc[0]
        rows.append({"method": method, "heads": int(first.heads), "kv_heads": int(first.kv_heads),
                     "parameters": int(first.parameters), "original": original,
                     "pruned": pruned, "tokens": tokens, "healed": float(last.value.mean()),
                     "seeds": n, "recovered": mean, "low": low, "high": high,
                     "per_seed": " ".join(f"{x:.3f}" for x in shares),
                     "target": verdict})  # fmt: skip
    return pd.DataFrame(rows)


def _display(t: pd.DataFrame) -> pd.DataFrame:
    def interval(r) -> str:
        if math.isnan(r.low):
            return f"{r.recovered:.1%} (one seed)"
        return f"{r.recovered:.1%} [{r.low:.1%}, {r.high:.1%}]"

    return pd.DataFrame({
        "method": t.method,
        "query / kv heads": [f"{r.heads} / {r.kv_heads}" for r in t.itertuples()],
        "parameters": t.parameters.map("{:,}".format),
        "perplexity: original": t.original.map("{:.2f}".format),
        "pruned": t.pruned.map("{:.2f}".format),
        "healed": [f"{r.healed:.2f} ({r.tokens:,} tokens)" for r in t.itertuples()],
        "increase won back [95% CI]": [interval(r) for r in t.itertuples()],
        f"target (>= {TARGET:.0%})": t.target,
    })  # fmt: skip


def best(t: pd.DataFrame) -> pd.Series:
    """The best third-of-the-heads pruned model: the lowest perplexity before healing."""
    return t.sort_values("pruned").iloc[0]


def healing_section(r: Findings, rep: MarkdownReport) -> None:
    heal = heal_table(r)
    if heal is None:
        return
    from probe.report.heal_plots import heal_curves_plot

    o = r.study.get("heal", {})
    t = recovery(heal)
    rep.heading("Healing by distillation")
    rep.paragraph(
        f"Each method removes {o.get('fraction', 0):.1%} of the query heads once; each of "
        f"{counted(int(o.get('seeds', 1)), 'seed')} then distills a copy from the unpruned model "
        f"(KL divergence at temperature {o.get('temperature')}, AdamW, learning rate "
        f"{o.get('lr')} after {o.get('warmup', 0):.0%} of the steps warming up, "
        f"{int(o.get('batch_tokens', 0)):,} tokens a step in rows of {o.get('seq_len')}) on the "
        "training pages of the shipped manuals corpus, the seed ordering the rows; perplexity is "
        f"measured on {int(o.get('eval_tokens', 0)):,} tokens of its held-out pages. The share "
        "won back is (pruned - healed) / (pruned - original) at the most tokens distilled, with "
        "a 95% t-interval over seeds; the target is met when the interval lies at or above "
        f"{TARGET:.0%} for the best pruned model (the lowest perplexity before healing)."
    )
    rep.table(_display(t), "heal_recovery.csv", data=t, digits=4)
    rep.figure(heal_curves_plot(heal), "heal.png",
               "Held-out perplexity against the tokens distilled (0: the pruned model before "
               "healing; band: the seeds' range; dashed: the unpruned model)")  # fmt: skip


def heal_answer(r: Findings) -> str | None:
    heal = heal_table(r)
    if heal is None:
        return None
    t = recovery(heal)
    b = best(t)
    others = "".join(f"; {x.method}: {x.pruned:.1f}" for x in t.itertuples()
                     if x.method != b.method)  # fmt: skip
    removed = int(heal[heal.stage == "original"].heads.iloc[0]) - int(b.heads)
    interval = ("" if math.isnan(b.low)
                else f", 95% CI {b.low:.1%} to {b.high:.1%} over {int(b.seeds)} seeds")  # fmt: skip
    words = {"met": "met", "missed": "missed", "undecided": "undecided by the interval"}
    return (f"Removing {removed} query heads raises held-out perplexity from {b.original:.1f} "
            f"to {b.pruned:.1f} at best ({b.method}{others}); distilling from the unpruned "
            f"model for {int(b.tokens):,} tokens brings it to {b.healed:.1f}, winning back "
            f"{b.recovered:.1%} of the increase{interval}: the target of half is "
            f"{words[b.target]}.")  # fmt: skip


def minitron(r: Findings) -> str | None:
    """Minitron's claim, checked in its direction at this study's budget."""
    heal = heal_table(r)
    if heal is None:
        return None
    ref = published("muralidharan2024")
    share = ref.values[0].value
    trained = published("allal2025").values[0].value
    t = recovery(heal)
    b = best(t)
    fraction = b.tokens / trained
    if b.target == "met":
        verdict = "agrees"
    elif b.target == "missed":
        verdict = "inconclusive: this budget is far below the paper's, which it does not test"
    else:
        verdict = "inconclusive"
    return (f"**{ref.short}** ({ref.claim_source}): pruning then retraining by distillation on "
            f"under {share:.0%} of the original training data recovers the model's quality. "
            f"Here, {int(b.tokens):,} tokens ({fraction:.1e} of the {trained:.0e} tokens "
            f"SmolLM2-135M was trained on, {published('allal2025').short}) win back "
            f"{b.recovered:.1%} of the perplexity increase of the best pruned model "
            f"({b.method}){'' if math.isnan(b.low) else f', 95% CI {b.low:.1%} to {b.high:.1%}'}"
            f": **{verdict}** in direction (more than half won back counts as agreeing). "
            "Differences: heads only (the paper also prunes depth, width and MLP neurons), a "
            "135M model, a budget about "
            f"{share * trained / max(b.tokens, 1):.0e} times smaller than 3% of the pre-training "
            "data, and perplexity on documentation rather than downstream benchmarks.")  # fmt: skip


def speed_section(r: Findings, rep: MarkdownReport) -> None:
    speed = r.tables.get("llama-cpp")
    if heal_table(r) is None:
        return
    rep.heading("In llama.cpp", 3)
    if speed is None or speed.empty:
        rep.paragraph("Not measured: llama-cpp-python was not installed when the study ran "
                      "(`bash scripts/llama-cpp.sh` builds it; the step then runs).")  # fmt: skip
        return
    t = speed_summary(speed)
    reps = int(speed.repeat.max()) + 1
    rep.paragraph(
        "The unpruned model and each pruned model (before healing: healing changes weights, "
        "not shapes) written by `probe export --format gguf` in float16 and run in llama.cpp "
        "(llama-cpp-python "
        + str(r.manifest.get("packages", {}).get("llama-cpp-python", "?"))
        + "), one thread, flash "
        "attention, a float16 key/value cache of 2,048 cells as llama.cpp reports it; a prompt "
        f"of 256 held-out tokens then 64 greedy tokens, median of {counted(reps, 'repeat')} "
        "alternating between the models, after every other step had finished."
    )
    shown = pd.DataFrame({
        "model": t.model, "arch": t.arch, "query / kv heads": [
            f"{int(x.heads)} / {int(x.kv_heads)}" for x in t.itertuples()],
        "file MiB": t.file_mib.map("{:.1f}".format),
        "KV cache MiB": t.kv_cache_mib.map("{:.2f}".format),
        "prompt tok/s": t.prompt_tok_s.map("{:.0f}".format),
        "decode tok/s": t.decode_tok_s.map("{:.1f}".format),
        "decode vs original": t.decode_vs_original.map("{:.2f}x".format),
        "KV cache vs original": t.kv_cache_vs_original.map("{:.2f}x".format),
    })  # fmt: skip
    rep.table(shown, "llama_cpp_speed.csv", data=t, digits=4)
