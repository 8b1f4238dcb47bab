"""`razor`: RazorAttention's head selection as published (Tang et al. 2024): the echo and
induction scores (`probe.kv.razor`) of every query head on repeated random tokens, a key/value
head scoring the max over its query heads for each statistic, and two rankings over all the
model's key/value heads, one per statistic: the top `induction_ratio` by induction score and
the top `echo_ratio` by echo score keep the full cache (Huawei's msmodelslim and golden-stick
default to 0.14 and 0.01, rank over the whole model and score a GQA group by its max, as here).

Without a share (`make_plan(..., None)`), the rule is the published one: round(ratio x heads)
of each ranking (rounded half to even, as msmodelslim's `round`), their union (a head in both
counts once, so the union can be smaller than the two counts). At a share s (a study comparing
methods at equal cache), the two counts split `full_count(s)` in the ratios' proportion (the
echo count rounded half up), and a head already taken by echo is replaced by the next
induction head, so the plan keeps exactly as many heads as every other method at s. Ties go to
the earlier layer, then the lower key/value head (msmodelslim keeps every head tied at the
cut).

The plan also carries the paper's treatment of the other heads (its Algorithm 1):
`buffer_ratio` C (a streaming head keeps max(window, N / C) recent tokens of N) and
`compensate` (the dropped tokens folded into one compensation token).
"""

from __future__ import annotations

from dataclasses import dataclass

from probe.errors import ProbeError
from probe.kv.methods import KVMethod
from probe.options import option


@dataclass(frozen=True)
class RepeatOptions:
    """The repeated random tokens the echo and induction scores are measured on."""

    period: int = option(64, low=2, help="random tokens per copy of the repeated sequence")
    rows: int = option(8, low=1, help="repeated sequences")


@dataclass(frozen=True)
class RazorOptions(RepeatOptions):
    # the published shares of all key/value heads (each ranking over the whole model)
    induction_ratio: float = option(0.14, low=0.0, high=1.0,
                                    help="share of heads kept full by induction score")  # fmt: skip
    echo_ratio: float = option(0.01, low=0.0, high=1.0,
                               help="share of heads kept full by echo score")  # fmt: skip
    buffer_ratio: float = option(0.0, low=0.0, help="C: a streaming head keeps max(window, N / C) "
                                 "recent tokens of N (0: the window only)")  # fmt: skip
    compensate: bool = option(True, help="fold the dropped tokens into one compensation token")


def fits(cfg, options: RepeatOptions, named) -> None:
    """Two copies of `period` tokens and a start within the model's learned positions; razor's
    ratios not both 0."""
    limit, period = cfg.max_positions, options.period
    if limit is not None and 2 * period + 1 > limit:
        raise ProbeError(
            f"{named('period')} {period} makes sequences of {2 * period + 1} tokens (two copies "
            f"and a start), past the model's {limit} learned positions; use {named('period')} "
            f"{(limit - 1) // 2} or less."
        )
    if isinstance(options, RazorOptions):
        check_ratios(options, named)


def check_ratios(options: RazorOptions, named) -> None:
    """One line when both ratios are 0: no head would be chosen, and no share split."""
    if options.induction_ratio == 0 and options.echo_ratio == 0:
        raise ProbeError(f"{named('induction_ratio')} and {named('echo_ratio')} are both 0, so "
                         "razor would choose no heads; use --method streaming.")  # fmt: skip


def measure(model, options: RepeatOptions, seed: int, say):
    """HEAD_COLUMNS: the echo and induction score of every query head."""
    from probe.kv.planning import with_groups
    from probe.kv.razor import razor_scores

    period, rows = options.period, options.rows
    say(f"echo and induction scores on {rows} repeated sequences of {period} tokens")
    return with_groups(razor_scores(model, period, rows, seed), model.cfg)


def scores(model, options: RazorOptions, seed, sink, window, prompts, say):
    import pandas as pd

    from probe.kv.planning import kv_table

    heads = measure(model, options, seed, say)
    tables = [kv_table(heads, model.cfg, (s,), "razor") for s in ("induction", "echo")]
    return heads, pd.concat(tables, ignore_index=True), {}


def counts(total: int, share: float | None, options: RazorOptions) -> tuple[int, int]:
    """(induction, echo): how many heads each ranking gives, of `total` key/value heads."""
    from probe.kv.planning import full_count, half_up

    induction, echo = options.induction_ratio, options.echo_ratio
    if share is None:  # as published, and rounded as msmodelslim rounds
        return round(total * induction), round(total * echo)
    n = full_count(share, total)
    by_echo = half_up(n * echo / (induction + echo))
    return n - by_echo, by_echo


def choose(scores, cfg, share: float | None, options: RazorOptions):
    """Per site, the key/value heads of the top induction and top echo rankings (the module's
    docstring: published without a share, topped up to the share's count with one)."""
    from probe.kv.planning import by_site, ranked

    check_ratios(options, lambda name: name)
    induction, echo = ranked(scores, "induction"), ranked(scores, "echo")
    n_induction, n_echo = counts(len(induction), share, options)
    if share is None:
        return by_site({*induction[:n_induction], *echo[:n_echo]}, cfg)
    keep = list(echo[:n_echo])
    keep += [h for h in induction if h not in keep][:n_induction]
    return by_site(keep, cfg)


def plan_fields(options: RazorOptions) -> dict:
    return {"buffer_ratio": options.buffer_ratio, "compensate": options.compensate}


DECLARES = KVMethod("razor", 20, "RazorAttention as published: the top 14% of key/value heads "
                    "by induction score and 1% by echo score", options=RazorOptions,
                    study_prefix="razor", scores=scores, fits=fits, choose=choose,
                    plan_fields=plan_fields)  # fmt: skip
