"""What a head study's report says of its key/value-cache plans (the `kv` table of
`probe.study.heads.steps.kv`): the plans' table (cache saved, peak saved, needle accuracy by length,
loss change), the target's table, the protocol the prompts were prefilled by, and the answer's
sentence on the plans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from probe.kv.summary import KEPT, SAVED
from probe.words import counted

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings


def _range(mean: float, low: float, high: float) -> str:
    return f"{mean:.2f}" if low == high else f"{mean:.2f} ({low:.2f}-{high:.2f})"


def _plans_display(table: pd.DataFrame) -> pd.DataFrame:
    """One row per plan: cache saved and needle accuracy at each length, loss change."""
    rows = []
    for (method, share), part in table.groupby(["method", "full_share"], sort=False):
        needles = part[part.prompts.notna()].sort_values("length")
        loss = part[part.loss.notna()]
        row = {"method": method, "full share": f"{share:g}",
               "full heads": int(part.full_heads.iloc[0])}  # fmt: skip
        for r in needles.itertuples():
            row[f"saved {r.length}"] = f"{100 * r.saved:.1f}%"
            row[f"accuracy {r.length}"] = _range(r.needle_accuracy, r.accuracy_min,
                                                 r.accuracy_max)  # fmt: skip
        if "peak_saved" in needles and needles.peak_saved.notna().any():
            row["peak saved"] = f"{100 * needles.peak_saved.min():.1f}%"
        if not loss.empty:
            row["loss change"] = f"{float(loss.loss_change.iloc[0]):+.3f}"
        rows.append(row)
    return pd.DataFrame(rows)


PROTOCOL = {
    "full": "each prompt is prefilled with full attention in every head and each streaming "
            "head's cache is then cut to its sink and window, as DuoAttention's and "
            "RazorAttention's reference code prefill (so the plan acts from the first decoded "
            "token on, and the cache's peak during prefill is the full cache's)",
    "chunked": "each prompt is prefilled in calls of {chunk:,} tokens, a call's queries seeing "
               "what the cache holds and the call's own keys, and each streaming head's cache is "
               "cut after each call (DuoAttention's chunked prefill)",
    "masked": "each prompt is prefilled with every streaming head restricted to its sink and "
              "window at every position (StreamingLLM's token-by-token setting, in one call)",
}  # fmt: skip


def protocol(o: dict) -> str:
    """How the study's passkey prompts entered the plans' caches (studies run before the
    prefill was a choice were masked)."""
    return PROTOCOL[o.get("prefill", "masked")].format(chunk=int(o.get("prefill_chunk", 1024)))


def _targets_display(t: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({
        "method": t.method, "full share": t.full_share.map("{:g}".format),
        "least saved": t.saved_min.map("{:.1%}".format),
        "least accuracy kept": t.kept_min.map("{:.1%}".format),
        "target met": t.meets.map({True: "yes", False: "no"}),
    })  # fmt: skip
    if "p_vs_streaming" in t:
        out["exact keys, plan / streaming"] = [
            "-" if pd.isna(r.p_vs_streaming) else
            f"{int(r.exact)}/{int(r.prompts)} / {int(r.streaming_exact)}/{int(r.streaming_prompts)}"
            for r in t.itertuples()
        ]  # fmt: skip
        out["p (plan > streaming)"] = t.p_vs_streaming.map(
            lambda p: "-" if pd.isna(p) else f"{p:.2g}")  # fmt: skip
    return out


def plans_section(r: Findings, rep: MarkdownReport) -> None:
    if r.kv is None:
        return
    from probe.report.kv_plots import kv_accuracy_plot, kv_loss_plot

    o = r.study.get("kv", {})
    table, t = r.kv
    rep.heading("What the key/value plans save")
    rep.paragraph(
        f"Every streaming head keeps the first {o.get('sink')} tokens and the last "
        f"{o.get('window')}; the others keep the whole cache. Passkey prompts of "
        f"{', '.join(f'{n:,}' for n in sorted(o.get('lengths', [])))} tokens, "
        f"{o.get('needles')} per length and seed (depths spread over the haystack), "
        f"{counted(int(o.get('seeds', 0)), 'seed')} of keys, haystacks and text rows (and of "
        "the random plans); "
        f"{protocol(o)}; the key is then decoded greedily through the evicting cache. Needle "
        "accuracy is the share of the key's tokens the output has at their place (mean over "
        "seeds, their range in brackets; the whole keys decoded right, pooled over seeds, are "
        "counted in kv_plans.csv). Cache saved is 1 - the bytes the cache held once the key was "
        "decoded / the full cache's on the same prompt; peak saved, the least over the lengths "
        "of the same for the most bytes held at once. Loss is on "
        f"{counted(int(o.get('loss_rows', 0)), 'text row')} of {o.get('loss_tokens'):,} tokens "
        "per seed, prefilled through the same cache with the streaming heads cut at every "
        "position (StreamingLLM's setting); its change is against the full cache. `streaming` "
        "at a share is every head streaming with its window widened to the share's memory."
    )
    rep.table(_plans_display(table), "kv_plans.csv", data=table, digits=3)
    rep.figure(kv_accuracy_plot(table, target=(SAVED, KEPT)), "kv_accuracy.png",
               f"Passkey accuracy against the key/value cache saved (shaded: the target, at "
               f"least {SAVED:.0%} saved at {KEPT:.0%} of the full cache's accuracy)")  # fmt: skip
    rep.figure(kv_loss_plot(table), "kv_loss.png", "Loss change against the cache saved")
    if t.empty:
        return
    rep.heading("The target", 3)
    rep.paragraph(
        f"A plan meets the target when it saves at least {SAVED:.0%} of the cache and keeps at "
        f"least {KEPT:.0%} of the full cache's needle accuracy at every length (point "
        "estimates over the seeds' prompts); against streaming at the same memory, the exact "
        "keys pooled over seeds and lengths are compared by a one-sided Fisher exact test."
    )
    rep.table(_targets_display(t), "kv_targets.csv", data=t, digits=3)


def _versus_streaming(row: pd.Series) -> str:
    if "p_vs_streaming" not in row or pd.isna(row.p_vs_streaming):
        return ""
    return (f" ({int(row.exact)}/{int(row.prompts)} keys exact against "
            f"{int(row.streaming_exact)}/{int(row.streaming_prompts)} for a streaming-only cache "
            f"of the same size, one-sided Fisher p = {row.p_vs_streaming:.2g})")  # fmt: skip


def kv_answer(r: Findings) -> str | None:
    """The key/value plans' sentence of the answer (None when the study measured none)."""
    if r.kv is None:
        return None
    o = r.study.get("kv", {})
    table, t = r.kv
    lengths = sorted(table[table.prompts.notna()].length.unique())
    span = f"{lengths[0]:,}" if len(lengths) == 1 else f"{lengths[0]:,} to {lengths[-1]:,}"
    if "full" not in set(table.method):
        return ("The key/value table has no full-cache rows to compare the plans with (the "
                "kv-full step has not run).")  # fmt: skip
    total = int(table[table.method == "full"].full_heads.iloc[0])
    text = (f"With the other heads keeping {o.get('sink')} sink tokens and a "
            f"{o.get('window')}-token window, at passkey lengths {span} tokens: ")  # fmt: skip
    met = t if t.empty else t[t.meets]
    if t.empty:
        text += "no head-role plans were measured"
    elif not met.empty:
        best = met.sort_values(["saved_min", "kept_min"], ascending=False).iloc[0]
        others = sorted(set(met.method) - {best.method})
        also = f" (so do {', '.join(others)} plans at some share)" if others else ""
        text += (f"{best.method} plans meet the target{also}, keeping the full cache for "
                 f"{int(best.full_heads)} of {total} key/value heads saves at least "
                 f"{best.saved_min:.0%} of the cache at every length and keeps at least "
                 f"{best.kept_min:.0%} of the full cache's needle accuracy"
                 f"{_versus_streaming(best)}")  # fmt: skip
    else:
        enough = t[t.saved_min >= SAVED]
        pool = enough if not enough.empty else t
        best = pool.sort_values(["kept_min", "saved_min"], ascending=False).iloc[0]
        text += (f"no head-role plan meets the target ({SAVED:.0%} saved at {KEPT:.0%} of the "
                 f"full cache's needle accuracy at every length); the closest, {best.method} "
                 f"with {int(best.full_heads)} of {total} key/value heads full, saves at least "
                 f"{best.saved_min:.0%} and keeps {best.kept_min:.0%} of the accuracy at its "
                 f"worst length{_versus_streaming(best)}")  # fmt: skip
    if not t.empty and "peak_saved_min" in t and float(best.peak_saved_min) < SAVED:
        text += ("; that saving is of the bytes held once the key is decoded: while the prompt "
                 "is prefilled the cache holds as much as the full cache does "
                 f"({best.peak_saved_min:.0%} saved)")  # fmt: skip
    stream = table[(table.method == "streaming") & (table.full_share == 0)]
    full = table[table.method == "full"]
    needles = stream[stream.prompts.notna()]
    if not needles.empty:
        text += (f"; streaming every head saves {needles.saved.min():.0%} or more with needle "
                 f"accuracy {needles.needle_accuracy.mean():.2f} (full cache "
                 f"{full[full.prompts.notna()].needle_accuracy.mean():.2f})")  # fmt: skip
    if "loss" not in table:
        return text + "."
    window = table[(table.method == "window") & table.loss.notna()]
    streamed = stream[stream.loss.notna()]
    if not window.empty and not streamed.empty and not full.empty:
        sink_change = float(streamed.loss_change.iloc[0])
        window_change = float(window.loss_change.iloc[0])
        text += (f", and its {o.get('sink')} sink tokens hold the loss at {sink_change:+.3f} "
                 "nats against the full cache where window attention alone is at "
                 f"{window_change:+.3f}")  # fmt: skip
    return text + "."
