"""What a healing study's report says (the `heal` and `heal-text` tables of `steps/heal.py`):
held-out perplexity against the tokens distilled, per pruning method with the seeds' range; the
share of the perplexity increase each method's healing wins back, with a t-interval over seeds;
the held-out text of each seed (pages and tokens of each project, what de-duplication dropped);
the target (at least half of the increase won back for the best pruned model) and the comparison
with Minitron's claim (Muralidharan et al. 2024); the llama.cpp timings with the range of their
ratios over repeats; and the answer's sentence.

The share won back by a seed's run is (pruned - healed) / (pruned - original), the three
perplexities of that seed (its pruned model, on its held-out text), healed at the largest token
count measured. The target is met when the lower end of the 95% t-interval over seeds is at
least TARGET, missed when its upper end is below, and undecided otherwise (one seed: no
interval, so never decided).
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


def heal_table(r: Findings, name: str = "heal") -> pd.DataFrame | None:
    heal = r.tables.get(name)
    return None if heal is None or heal.empty else heal


def _per_seed(part: pd.DataFrame, tokens: int) -> pd.DataFrame:
    """One method's perplexity rows: original, pruned and healed (at `tokens`) per seed."""
    healed = part[(part.stage == "healed") & (part.tokens == tokens)]
    return pd.DataFrame({
        "original": part[part.stage == "original"].groupby("seed").value.mean(),
        "pruned": part[part.stage == "pruned"].groupby("seed").value.mean(),
        "healed": healed.groupby("seed").value.mean(),
    }).dropna()  # fmt: skip


def _t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval (NaN ends below two values)."""
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    if n < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, n - 1)) * pd.Series(values).std(ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def _distinct(values) -> str:
    return " or ".join(dict.fromkeys(values))


def recovery(heal: pd.DataFrame) -> pd.DataFrame:
    """Per method: heads and parameters kept (each seed prunes its own model), perplexity
    original / pruned / healed (at the largest tokens, means over seeds), the share won back
    per seed (each seed's own three perplexities), its mean and 95% t-interval, the verdict,
    and how far above the original's the healed perplexity stays (mean of healed / original -
    1)."""
    ppl = heal[heal.metric == "perplexity"]
    rows = []
    for method, part in ppl.groupby("method", sort=False):
        healed = part[part.stage == "healed"]
        tokens = int(healed.tokens.max()) if len(healed) else 0
        seeds = _per_seed(part, tokens)
        shares = [(r.pruned - r.healed) / (r.pruned - r.original) if r.pruned > r.original
                  else float("nan") for r in seeds.itertuples()]  # fmt: skip
        mean, low, high = _t_interval(shares)
        verdict = "met" if low >= TARGET else "missed" if high < TARGET else "undecided"
        pruned = part[part.stage == "pruned"].sort_values("seed")
        first = pruned.iloc[0]
        rows.append({"method": method, "heads": int(first.heads), "kv_heads": int(first.kv_heads),
                     "parameters": int(first.parameters),
                     "shapes": _distinct(f"{r.heads} / {r.kv_heads}" for r in pruned.itertuples()),
                     "sizes": _distinct(f"{r.parameters:,}" for r in pruned.itertuples()),
                     "original": seeds.original.mean(), "pruned": seeds.pruned.mean(),
                     "tokens": tokens, "healed": seeds.healed.mean(), "seeds": len(shares),
                     "recovered": mean, "low": low, "high": high,
                     "per_seed": " ".join(f"{x:.3f}" for x in shares), "target": verdict,
                     "above_original": (seeds.healed / seeds.original - 1).mean()})  # fmt: skip
    return pd.DataFrame(rows)


def _display(t: pd.DataFrame) -> pd.DataFrame:
    def interval(r) -> str:
        if math.isnan(r.low):
            return f"{r.recovered:.1%} (one seed)"
        return f"{r.recovered:.1%} [{r.low:.1%}, {r.high:.1%}]"

    return pd.DataFrame({
        "method": t.method,
        "query / kv heads": t.shapes,
        "parameters": t.sizes,
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
        f"Each method removes {o.get('fraction', 0):.1%} of the query heads, once per seed: seed "
        "s ranks the heads on importance split s, so every seed prunes its own model. Each of "
        f"{counted(int(o.get('seeds', 1)), 'seed')} then distills its pruned model from the "
        f"unpruned one (KL divergence at temperature {o.get('temperature')}, AdamW, learning "
        f"rate {o.get('lr')} after {o.get('warmup', 0):.0%} of the steps warming up, "
        f"{int(o.get('batch_tokens', 0)):,} tokens a step in rows of {o.get('seq_len')}) on the "
        "training pages of the shipped manuals corpus, the seed ordering the rows, and "
        f"measures perplexity on {int(o.get('eval_tokens', 0)):,} tokens of held-out text the "
        "seed draws (below): the interval over seeds covers the pruning data, the training "
        "rows and the evaluation text. The share won back is (pruned - healed) / (pruned - "
        "original), each seed's own perplexities, at the most tokens distilled, with a 95% "
        "t-interval over seeds; the target is met when the interval lies at or above "
        f"{TARGET:.0%} for the best pruned model (the lowest perplexity before healing). "
        "Perplexities shown are means over seeds."
    )
    rep.table(_display(t), "heal_recovery.csv", data=t, digits=4)
    rep.figure(heal_curves_plot(heal), "heal.png",
               "Held-out perplexity against the tokens distilled (0: the pruned model before "
               "healing; line: mean over seeds, band: their range; dashed: the unpruned "
               "model)")  # fmt: skip
    _heldout_part(r, rep)


def projects_used(text: pd.DataFrame) -> str:
    """How many projects the measured text of each seed draws on ("12", or "11 to 12")."""
    counts = sorted({int(n) for n in text[text.tokens_used > 0].groupby("seed").size()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def _heldout_part(r: Findings, rep: MarkdownReport) -> None:
    """The held-out text of each seed (the `heal-text` table): how it was drawn and what
    de-duplication dropped."""
    text = heal_table(r, "heal-text")
    if text is None:
        return
    seeds = sorted(int(s) for s in text.seed.unique())
    one = text[text.seed == seeds[0]]
    n = int(one.ngram.iloc[0])
    rep.heading("Held-out text", 3)
    rep.paragraph(
        f"Held-out pages of {projects_used(text)} projects (of the corpus's {len(one)}): the "
        f"projects take turns, a passage (at most {int(r.study['heal'].get('passage', 0)):,} "
        "words of consecutive sentences) each, each project's pages in an order the seed draws, "
        "until the tokens measured are reached. Before that, every held-out sentence that "
        f"shares {n} consecutive words (whitespace-split, so the same for any tokenizer) with a "
        "training page was dropped, with every sentence those words reach into, and no passage "
        "spans a dropped sentence: no passage of the measured text shares "
        f"{n} consecutive words with a training page. Dropped: "
        f"{int(one.sentences_dropped.sum()):,} of {int(one.sentences.sum()):,} sentences "
        f"({int(one.words_dropped.sum()):,} of {int(one.words.sum()):,} words, "
        f"{one.words_dropped.sum() / max(one.words.sum(), 1):.1%}) from "
        f"{int(one.pages_cut.sum())} of {int(one.pages.sum())} pages, "
        f"{int(one.pages.sum() - one.pages_kept.sum())} of which were left empty."
    )
    used = text.pivot_table(index="project", columns="seed", values=["pages_used", "tokens_used"],
                            sort=False)  # fmt: skip
    per_seed = " / ".join(str(s) for s in seeds)
    shown = pd.DataFrame({
        "project": one.project,
        "held-out pages (kept)": [f"{x.pages} ({x.pages_kept})" for x in one.itertuples()],
        "sentences dropped": [f"{x.sentences_dropped} of {x.sentences}" for x in one.itertuples()],
        f"pages used (seed {per_seed})": [" / ".join(str(int(used.loc[p, ("pages_used", s)]))
                                          for s in seeds) for p in one.project],
        f"tokens used (seed {per_seed})": [" / ".join(f"{int(used.loc[p, ('tokens_used', s)]):,}"
                                           for s in seeds) for p in one.project],
    })  # fmt: skip
    rep.table(shown, "heal_text.csv", data=text, digits=4)


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
            f"to {b.pruned:.1f} at best ({b.method}{others}; means over seeds); distilling from "
            f"the unpruned model for {int(b.tokens):,} tokens brings it to {b.healed:.1f}, "
            f"{b.above_original:.0%} above the unpruned model's, winning back "
            f"{b.recovered:.1%} of the increase{interval}: the target of half is "
            f"{words[b.target]}.")  # fmt: skip


def minitron(r: Findings) -> str | None:
    """Minitron's claim at this study's budget: more than half of the increase won back is
    consistent with it in direction; the claim itself, the model's quality recovered, needs the
    healed perplexity at the unpruned model's or below (then it agrees)."""
    heal = heal_table(r)
    if heal is None:
        return None
    ref = published("muralidharan2024")
    share = ref.values[0].value
    trained = published("allal2025").values[0].value
    t = recovery(heal)
    b = best(t)
    fraction = b.tokens / trained
    verdict, why = {
        "met": ("consistent in direction", " (more than half of the increase won back; the "
                "quality itself is not recovered while the perplexity stays above the unpruned "
                "model's)"),
        "missed": ("inconclusive", ": this budget is far below the paper's, which it does not "
                   "test"),
    }.get(b.target, ("inconclusive", ""))  # fmt: skip
    if b.target == "met" and b.above_original <= 0:  # the quality recovered: the claim itself
        verdict, why = "agrees", " (the healed perplexity at or below the unpruned model's)"
    ci = "" if math.isnan(b.low) else f", 95% CI {b.low:.1%} to {b.high:.1%}"
    return (f"**{ref.short}** ({ref.claim_source}): pruning then retraining by distillation on "
            f"under {share:.0%} of the original training data recovers the model's quality. "
            f"Here, {int(b.tokens):,} tokens ({fraction:.1e} of the {trained:.0e} tokens "
            f"SmolLM2-135M was trained on, {published('allal2025').short}) win back "
            f"{b.recovered:.1%} of the perplexity increase of the best pruned model "
            f"({b.method}){ci}, and its perplexity {_relative(b.above_original)} the "
            f"unpruned model's: **{verdict}**{why}. Differences: heads only (the paper also prunes "
            "depth, width and MLP neurons), a 135M model, a budget about "
            f"{share * trained / max(b.tokens, 1):.0e} times smaller than 3% of the pre-training "
            "data, and perplexity on documentation rather than downstream benchmarks.")  # fmt: skip


def _relative(above: float) -> str:
    return f"stays {above:.0%} above" if above > 0 else f"is {-above:.0%} below"


def ratio_ranges(speed: pd.DataFrame, metric: str) -> pd.Series:
    """Per model: (lowest, highest) over repeats of its `metric` over the original's in the
    same repeat (the repeats alternate between the models, so a repeat pairs them)."""
    rows = speed[speed.metric == metric].pivot_table(index="repeat", columns="model",
                                                     values="value")  # fmt: skip
    ratios = rows.div(rows["original"], axis=0)  # [repeat, model]
    return pd.Series({m: (float(ratios[m].min()), float(ratios[m].max())) for m in ratios})


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
        "The unpruned model and each pruned model of seed 0 (before healing: healing changes "
        "weights, not shapes) written by `probe export --format gguf` in float16 and run in "
        "llama.cpp (llama-cpp-python "
        + str(r.manifest.get("packages", {}).get("llama-cpp-python", "?"))
        + "), one thread, flash "
        "attention, a float16 key/value cache of 2,048 cells as llama.cpp reports it; a prompt "
        f"of 256 held-out tokens (seed 0's text) then 64 greedy tokens, median of "
        f"{counted(reps, 'repeat')} alternating between the models, after every other step "
        "had finished; in brackets, the lowest and highest ratio of a repeat (each repeat "
        "times every model once)."
    )
    decode = ratio_ranges(speed, "decode_tokens_per_s")
    t["decode_vs_original_low"] = [decode[m][0] for m in t.model]
    t["decode_vs_original_high"] = [decode[m][1] for m in t.model]

    def ratio(x) -> str:
        if reps < 2 or x.model == "original":
            return f"{x.decode_vs_original:.2f}x"
        return (f"{x.decode_vs_original:.2f}x [{x.decode_vs_original_low:.2f}, "
                f"{x.decode_vs_original_high:.2f}]")  # fmt: skip

    shown = pd.DataFrame({
        "model": t.model, "arch": t.arch, "query / kv heads": [
            f"{int(x.heads)} / {int(x.kv_heads)}" for x in t.itertuples()],
        "file MiB": t.file_mib.map("{:.1f}".format),
        "KV cache MiB": t.kv_cache_mib.map("{:.2f}".format),
        "prompt tok/s": t.prompt_tok_s.map("{:.0f}".format),
        "decode tok/s": t.decode_tok_s.map("{:.1f}".format),
        "decode vs original [range over repeats]": [ratio(x) for x in t.itertuples()],
        "KV cache vs original": t.kv_cache_vs_original.map("{:.2f}x".format),
    })  # fmt: skip
    rep.table(shown, "llama_cpp_speed.csv", data=t, digits=4)
