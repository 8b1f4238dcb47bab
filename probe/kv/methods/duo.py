"""`duo`: DuoAttention's gate alpha per key/value head, trained on passkey prompts
(`probe.kv.duo`); the gates are already per key/value head."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from probe.errors import ProbeError
from probe.kv.methods import KVMethod
from probe.options import check, option


@dataclass(frozen=True)
class DuoOptions:
    steps: int = option(40, low=1, help="Adam steps on the gates (4 passkey prompts each)")
    lr: float = option(0.05, low=1e-9, help="Adam's learning rate on the gates")
    l1: float = option(0.05, low=0, help="weight of the L1 penalty on the mean gate")


@dataclass(frozen=True)
class DuoSettings(DuoOptions):
    """The gates' training (`probe.kv.duo.duo_gates`): the method's options (steps, lr, l1,
    with their defaults and bounds) and the passkey prompts' shape."""

    batch: int = 4  # passkey prompts per step
    key_len: int = 8  # tokens in a passkey

    def check(self) -> None:
        check(self)  # steps >= 1, lr > 0, l1 >= 0, all finite (a NaN rate: a plan of noise)
        if self.batch < 1 or self.key_len < 1:
            raise ProbeError(f"duo needs at least one prompt and passkey token a step; got "
                             f"batch {self.batch}, key_len {self.key_len}.")  # fmt: skip


def scores(model, options: DuoOptions, seed, sink, window, prompts, say):
    import pandas as pd

    from probe.kv.duo import duo_gates
    from probe.kv.planning import HEAD_COLUMNS, kv_scores

    # DuoSettings (the prompts' shape too) as they are, else the options with its defaults
    settings = options if isinstance(options, DuoSettings) else DuoSettings(**asdict(options))
    alphas, notes = duo_gates(model, sink, window, settings, seed, say)
    sites = model.cfg.sites()
    kv = kv_scores(model.cfg, "duo", [v for a in alphas for v in a.tolist()])  # sites, groups
    heads = pd.DataFrame(
        [{"layer": s.index, "site": s.name, "head": h, "kv_head": s.group(h),
          "statistic": "duo_alpha", "value": float(a[s.kv_index()[i]])}
         for s, a in zip(sites, alphas, strict=True) for i, h in enumerate(s.kept_heads)],
        columns=HEAD_COLUMNS)  # fmt: skip
    return heads, kv, notes


DECLARES = KVMethod("duo", 30, "DuoAttention's gates trained on passkey prompts",
                    options=DuoOptions, study_prefix="duo", scores=scores)  # fmt: skip
