"""One key/value plan measured as the KV-cache study measures it: passkey accuracy at several
lengths (greedy decoding through the evicting cache, `probe.kv.evaluate.score_needle`) and
next-token loss on long text rows (each row prefilled through the same kind of cache, masked:
StreamingLLM's setting), each with the bytes that cache really held, for every seed. How a
passkey prompt enters the cache is `probe.kv.evaluate.Prefill` (the papers' full prefill, then
the cut, by default).

Rows (`COLUMNS`): method, full_share, length, seed, metric (`needle_accuracy`: the share of the
key's tokens the greedy output has at their place, `needle_exact`: the share of prompts whose
whole key came out right, `loss`: mean next-token loss in nats), value, kv_bytes (the cache's
bytes once the key is decoded: the prompt and every key token but the last, which is never fed
back; or after the text row; the mean over the seed's prompts or rows), kv_peak_bytes (the most
the cache held at once, likewise), n (prompts or scored tokens), full_heads (how many key/value
heads kept the full cache) and full (which: `L<layer>K<kv head>`, space-separated; `all` for
every head).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from probe.kv.evaluate import Prefill, Prefills, score_needle
from probe.kv.needles import passkey_prompts
from probe.model import Transformer

COLUMNS = ["method", "full_share", "length", "seed", "metric", "value", "kv_bytes",
           "kv_peak_bytes", "n", "full_heads", "full"]  # fmt: skip


def full_names(plan: Any, cfg: Any) -> str:
    """The full key/value heads of `plan`, as L<layer>K<kv head> ("all" when every head is)."""
    if all(set(s.kept_groups) <= set(f) for s, f in zip(cfg.sites(), plan.full, strict=True)):
        return "all"
    return " ".join(f"L{i}K{g}" for i, groups in enumerate(plan.full) for g in groups)


def _heads(plan: Any, cfg: Any) -> dict:
    return {"full_heads": sum(len(f) for f in plan.full), "full": full_names(plan, cfg)}


@torch.no_grad()
def row_loss(model: Transformer, inputs: torch.Tensor, targets: torch.Tensor,
             scored: torch.Tensor, plan: Any) -> tuple[float, int, int, int]:  # fmt: skip
    """(summed next-token loss, scored tokens, cache bytes, the most it held at once) of one text
    row inputs [seq] prefilled through a masked cache made with `plan` (the plan's full forward,
    its bytes measured)."""
    device = model.embed.weight.device
    cache = model.new_cache(plan)
    logits = model(inputs.to(device).unsqueeze(0), cache=cache)[0]  # [seq, vocab]
    mask = scored.to(device)
    losses = F.cross_entropy(logits[mask].float(), targets.to(device)[mask], reduction="sum")
    return float(losses), int(mask.sum()), cache.nbytes, cache.peak_nbytes


def measure_plan(
    model: Transformer,
    tokenizer,
    method: str,
    full_share: float,
    plans: Callable[[int, int], Any],
    lengths: Sequence[int],
    seeds: int,
    needles: int,
    text_rows: Sequence[Any],
    progress: Callable[[int, int], None] | None = None,
    prefill: Prefill = Prefill(),
    kept: Prefills | None = None,
) -> pd.DataFrame:
    """The rows of one `method` and `full_share`: `plans(seed, length)` gives the plan for that
    seed and input length (a random plan is drawn per seed; a memory-matched streaming plan's
    window follows the length); `text_rows[seed]` is that seed's batch of causal-LM rows;
    `prefill`: how a passkey prompt enters the cache (`kept`: full prefills to reuse)."""
    rows: list[dict] = []
    total, done = seeds * (len(lengths) * needles + text_rows[0].inputs.shape[0]), 0
    for seed in range(seeds):
        head = {"method": method, "full_share": full_share, "seed": seed}
        for length in lengths:
            plan = plans(seed, length)
            scores = []  # (needle_accuracy, needle_exact, bytes, peak bytes) per prompt
            for prompt in passkey_prompts(tokenizer, needles, length, seed):
                scores.append(score_needle(model, prompt, plan, prefill, kept))
                done += 1
                if progress:
                    progress(done, total)
            share, exact, held, peak = zip(*scores, strict=True)
            kv, most = sum(held) / len(held), sum(peak) / len(peak)
            for metric, values in (("needle_accuracy", share), ("needle_exact", exact)):
                rows.append({**head, **_heads(plan, model.cfg), "length": length,
                             "metric": metric, "value": sum(values) / len(values),
                             "kv_bytes": kv, "kv_peak_bytes": most,
                             "n": len(values)})  # fmt: skip
        batch = text_rows[seed]
        plan = plans(seed, int(batch.inputs.shape[1]))
        total_loss, count, held, peak = 0.0, 0, [], []
        for r in range(batch.inputs.shape[0]):
            loss, n, nbytes, most = row_loss(model, batch.inputs[r], batch.targets[r],
                                             batch.loss_mask[r], plan)  # fmt: skip
            total_loss, count = total_loss + loss, count + n
            held.append(nbytes)
            peak.append(most)
            done += 1
            if progress:
                progress(done, total)
        rows.append({**head, **_heads(plan, model.cfg), "length": int(batch.inputs.shape[1]),
                     "metric": "loss", "value": total_loss / max(count, 1),
                     "kv_bytes": sum(held) / len(held), "kv_peak_bytes": sum(peak) / len(peak),
                     "n": count})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
