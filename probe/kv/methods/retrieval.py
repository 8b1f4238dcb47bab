"""`retrieval`: Wu et al. 2024's retrieval score (`probe.analysis.retrieval`) per query head on
needle prompts built from text; a key/value head scores the max over its query heads."""

from __future__ import annotations

from dataclasses import dataclass

from probe.errors import ProbeError
from probe.kv.methods import KVMethod
from probe.options import option


@dataclass(frozen=True)
class RetrievalOptions:
    needles: int = option(4, low=1, help="needle prompts")
    context: int = option(256, low=64, help="tokens per needle prompt")


def prompts(docs, tokenizer, options: RetrievalOptions, seed: int) -> list:
    """`options.needles` needle prompts of about `options.context` tokens of `docs`."""
    from probe.analysis.retrieval import needle_prompts

    return needle_prompts(docs, tokenizer, options.needles, options.context, seed=seed)


def fits(cfg, options: RetrievalOptions, named) -> None:
    limit = cfg.max_positions
    if limit is not None and options.context > limit:
        raise ProbeError(f"{named('context')} {options.context} is longer than the model's "
                         f"{limit} positions.")  # fmt: skip


def retrieval_heads(model, prompts) -> tuple:
    """Wu et al.'s retrieval score per query head (statistic "retrieval") and the prompts it
    rests on; one line when the model retrieved none of the needles (the score is then
    undefined)."""
    from probe.analysis.retrieval import retrieval_scores

    table = retrieval_scores(model, prompts)
    if table.empty or int(table["prompts"].iloc[0]) == 0:
        recall = float(table["recall"].iloc[0]) if not table.empty else 0.0
        raise ProbeError(
            f"the model copied none of the {len(prompts)} needles (mean needle recall "
            f"{recall:.2f}), so retrieval scores are undefined; use more or shorter needle "
            "prompts, or another method (razor needs none)."
        )
    notes = {"needle_prompts": len(prompts), "prompts_retrieved": int(table["prompts"].iloc[0]),
             "needle_recall": float(table["recall"].iloc[0])}  # fmt: skip
    return table[["layer", "site", "head", "statistic", "value"]], notes


def scores(model, options, seed, sink, window, prompts, say):
    from probe.kv.planning import kv_table, with_groups

    if not prompts:
        raise ProbeError("the retrieval method needs needle prompts (at least one).")
    say(f"retrieval scores on {len(prompts)} needle prompts")
    table, notes = retrieval_heads(model, prompts)
    heads = with_groups(table, model.cfg)
    return heads, kv_table(heads, model.cfg, ("retrieval",), "retrieval"), notes


DECLARES = KVMethod("retrieval", 10, "Wu et al. 2024", options=RetrievalOptions,
                    study_prefix="score", scores=scores, prompts=prompts, fits=fits,
                    study_defaults=(("needles", 20),))  # fmt: skip
