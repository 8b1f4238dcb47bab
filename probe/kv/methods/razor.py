"""`razor`: RazorAttention's echo and induction scores (`probe.kv.razor`) per query head on
repeated random tokens, the larger of the two; a key/value head scores the max over its query
heads."""

from __future__ import annotations

from dataclasses import dataclass

from probe.errors import ProbeError
from probe.kv.methods import KVMethod
from probe.options import option


@dataclass(frozen=True)
class RazorOptions:
    period: int = option(64, low=2, help="random tokens per copy of the repeated sequence")
    rows: int = option(8, low=1, help="repeated sequences")


def fits(cfg, options: RazorOptions, named) -> None:
    """Two copies of `period` tokens and a start within the model's learned positions."""
    limit, period = cfg.max_positions, options.period
    if limit is not None and 2 * period + 1 > limit:
        raise ProbeError(
            f"{named('period')} {period} makes sequences of {2 * period + 1} tokens (two copies "
            f"and a start), past the model's {limit} learned positions; use {named('period')} "
            f"{(limit - 1) // 2} or less."
        )


def scores(model, options: RazorOptions, seed, sink, window, prompts, say):
    from probe.kv.planning import kv_table, with_groups
    from probe.kv.razor import razor_scores

    period, rows = options.period, options.rows
    say(f"echo and induction scores on {rows} repeated sequences of {period} tokens")
    heads = with_groups(razor_scores(model, period, rows, seed), model.cfg)
    return heads, kv_table(heads, model.cfg, ("echo", "induction"), "razor"), {}


DECLARES = KVMethod("razor", 20, "RazorAttention's echo and induction scores",
                    options=RazorOptions, study_prefix="razor", scores=scores,
                    fits=fits)  # fmt: skip
