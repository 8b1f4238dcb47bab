"""`duo`: DuoAttention's gate alpha per key/value head, trained on passkey prompts in text
(`probe.kv.duo`; random-token passkeys when there is no text); the gates are already per
key/value head. The reference's values (mit-han-lab/duo-attention, `scripts/train.sh`): 2,000
steps at lr 0.02, l1 0.05, a fifth of warm-up and of decay, 10 passkeys in 1,000-32,000 tokens,
training sink 128 and window 256 (`train_sink`, `train_window`), deployed with sink 64 and window
256 (the plan's --sink and --window)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from probe.errors import ProbeError
from probe.kv.methods import KVMethod
from probe.options import check, option


@dataclass(frozen=True)
class DuoOptions:
    steps: int = option(48, low=1, help="Adam steps on the gates, one passkey prompt each, fewer "
                        "when the gates separate; the reference: 2,000")  # fmt: skip
    lr: float = option(0.05, low=1e-9, help="Adam's peak learning rate on the gates; the "
                       "reference: 0.02 over 2,000 steps")  # fmt: skip
    l1: float = option(0.05, low=0, help="weight of the L1 penalty on the mean gate")
    warmup: float = option(0.2, low=0, high=0.5, help="share of the steps in linear warm-up, "
                           "and again in linear decay; the reference: a fifth")  # fmt: skip
    prompt_tokens: int = option(1024, low=64, help="tokens per passkey prompt of text; the "
                                "reference: 1,000-32,000 of text and its passkeys")  # fmt: skip
    passkeys: int = option(2, low=1, high=20, help="passkeys of 32 words per prompt of text; "
                           "the reference: 10")  # fmt: skip
    train_sink: int = option(0, low=0, help="sink tokens of the streaming side in training, "
                             "0 for the plan's sink; the reference trains with 128")  # fmt: skip
    train_window: int = option(0, low=0, help="recent tokens of the streaming side in training, "
                               "0 for the plan's window; the reference: 256")  # fmt: skip


@dataclass(frozen=True)
class DuoSettings(DuoOptions):
    """The gates' training (`probe.kv.duo.duo_gates`): the method's options (with their
    defaults and bounds) and the prompts' shape."""

    batch: int = 1  # passkey prompts per step (the reference's)
    key_words: int = 32  # words in a passkey in text (the reference's)
    key_len: int = 8  # tokens in a random-token passkey (without text)

    def check(self) -> None:
        check(self)  # steps >= 1, lr > 0, l1 >= 0, all finite (a NaN rate: a plan of noise)
        if min(self.batch, self.key_words, self.key_len) < 1:
            raise ProbeError(f"duo needs at least one prompt and passkey token a step; got "
                             f"batch {self.batch}, key_words {self.key_words}, key_len "
                             f"{self.key_len}.")  # fmt: skip


def settings_of(options: DuoOptions) -> DuoSettings:
    """DuoSettings as they are, else the options with the prompts' default shape."""
    return options if isinstance(options, DuoSettings) else DuoSettings(**asdict(options))


def prompts(docs, tokenizer, options: DuoOptions, seed: int) -> list:
    """A passkey prompt in `docs` for every step: `options.prompt_tokens` tokens each."""
    from probe.kv.duo import text_passkeys

    s = settings_of(options)
    return text_passkeys(docs, tokenizer, s.steps * s.batch, s.prompt_tokens, s.passkeys,
                         s.key_words, seed)  # fmt: skip


def scores(model, options: DuoOptions, seed, sink, window, prompts, say):
    import pandas as pd

    from probe.kv.duo import duo_gates
    from probe.kv.planning import HEAD_COLUMNS, kv_scores

    alphas, notes = duo_gates(model, sink, window, settings_of(options), seed, prompts, say)
    sites = model.cfg.sites()
    kv = kv_scores(model.cfg, "duo", [v for a in alphas for v in a.tolist()])  # sites, groups
    heads = pd.DataFrame(
        [{"layer": s.index, "site": s.name, "head": h, "kv_head": s.group(h),
          "statistic": "duo_alpha", "value": float(a[s.kv_index()[i]])}
         for s, a in zip(sites, alphas, strict=True) for i, h in enumerate(s.kept_heads)],
        columns=HEAD_COLUMNS)  # fmt: skip
    return heads, kv, notes


DECLARES = KVMethod("duo", 30, "DuoAttention's gates trained on passkey prompts",
                    options=DuoOptions, study_prefix="duo", scores=scores,
                    prompts=prompts)  # fmt: skip
