"""`razor-max`: RazorAttention's echo and induction scores (`probe.kv.razor`) as one number per
head, the larger of the two, ranked at a share: probe's `razor` until it chose heads as
published (`probe.kv.methods.razor`), kept so that the plans and studies made with it can be
made again. A key/value head scores the max over its query heads."""

from __future__ import annotations

from probe.kv.methods import KVMethod
from probe.kv.methods.razor import RepeatOptions, fits, measure


def scores(model, options: RepeatOptions, seed, sink, window, prompts, say):
    from probe.kv.planning import kv_table

    heads = measure(model, options, seed, say)
    return heads, kv_table(heads, model.cfg, ("echo", "induction"), "razor-max"), {}


DECLARES = KVMethod("razor-max", 25, "the larger of RazorAttention's echo and induction scores: "
                    "probe's razor until it chose as published",
                    options=RepeatOptions, study_prefix="razor_max", scores=scores,
                    fits=fits)  # fmt: skip
