"""DuoAttention's retrieval-head gates (Xiao et al., ICLR 2025), on probe's model.

Every key/value head of every causal self-attention site gets a gate alpha in [0, 1]; its query
heads' output is alpha * (full attention) + (1 - alpha) * (streaming attention: the first `sink`
keys and the last `window`: a key/value plan's streaming rule), each site's alphas given at its
`mix` point (`probe.model.points`). With the model frozen, only the gates are optimized (Adam,
clamped to [0, 1] after each step, starting at 1 as DuoAttention does) so that the mixed model's
last hidden states (after the final norm) at the prompts' target positions match the full model's:

    loss = mean over target positions of mean_d (h_mixed - h_full)^2 + l1 * mean(alpha)

(DuoAttention's distillation loss and L1 penalty, `reg_weight` there.) Key/value heads with the
largest alpha keep the full cache (`probe.kv.planning.choose_full`).

The recipe follows the reference code (mit-han-lab/duo-attention: `duo_attn/train.py`,
`duo_attn/data.py`, `scripts/train.sh`): passkeys of 32 random NATO-alphabet words inserted into
text at depths drawn from 5-95% of it, each announced as "Remember this sequence of words, it's the
first passkey to the vault:" and asked for at the end ("Based on the content of the book, what is
the first passkey to the vault?\\nPasskey:" and the key), the targets being every token of that
question-and-answer tail (the reference's labels); a learning rate warmed up linearly over the
first fifth of the steps and decayed linearly over the last fifth, never below a tenth
(`lr_scale`). Training stops early once the gates have separated (`SEPARATED`).

Differences from the reference, for a CPU: prompts of one length (`prompt_tokens`, 1,024 by
default) instead of 1,000-32,000 tokens of haystack, 2 passkeys instead of 10, a few dozen steps
instead of 2,000 (so a larger peak rate), a random stretch of the given text as the haystack (the
reference: the start of BookSum), no chat token before the frame. Without text (a model with no
tokenizer) the prompts are token-level passkeys: random tokens with a random-token passkey inserted
at least a window before its repeat, which ends the prompt and is the target. The reference trains
with sink 128 and window 256 and deploys with sink 64 and window 256; here the streaming side
trains with the plan's sink and window unless `train_sink` / `train_window` say otherwise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from probe.errors import ProbeError
from probe.kv.plan import KVPlan
from probe.model import Transformer
from probe.words import counted

# the reference's passkey words, the ordinal that names each passkey, and its frame and wording
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")  # fmt: skip
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
            "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
            "seventeenth", "eighteenth", "nineteenth", "twentieth")  # fmt: skip
FRAME = ("This is a very long story book: <book>", " </book>.\n\n")
NEEDLE = "Remember this sequence of words, it's the {} passkey to the vault:"
QUESTION = "Based on the content of the book, what is the {} passkey to the vault?\nPasskey:"
SEPARATOR = "\n\n"
DEPTHS = (0.05, 0.95)  # the share of the text before a passkey (the reference's needle depths)
FLOOR = 0.1  # the learning rate's floor, as a share of the peak, at both ends of the schedule
# a gate is decided within this of 0 or 1; the gates have separated when every one is decided
# and the steps' rates add up to at least 1: Adam moves a gate about one rate a step, so by then
# the L1 push alone would have carried a gate from its start at 1 to 0, and a gate still at 1
# has resisted it (before, every gate is "decided" only because none has moved)
SEPARATED = 0.05


def streaming_plan(model: Transformer, sink: int, window: int) -> KVPlan:
    """The plan in which every key/value head streams (the mixed forward's streaming side)."""
    return KVPlan("duo", 0.0, sink, window, tuple(() for _ in model.cfg.sites()))


@contextmanager
def frozen(model: Transformer) -> Iterator[None]:
    """The model's parameters do not require gradients inside (restored on exit)."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in saved:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


@contextmanager
def mixing(model: Transformer, alphas: Sequence[torch.Tensor]) -> Iterator[None]:
    """Inside, a forward with a plan (`plan=`) mixes each site's full and streaming head outputs
    by `alphas` (per site, [kept key/value heads] in the site's order), a group's query heads
    sharing its gate: the sites' `mix` points return them."""
    blocks = list(model.blocks)
    if len(alphas) != len(blocks):
        raise ValueError(f"{len(alphas)} gate vectors for {len(blocks)} attention sites")
    for block, alpha in zip(blocks, alphas, strict=True):
        attn = block.attn
        if attn.observer is not None:
            raise ValueError("DuoAttention's mixed forward cannot be observed")
        if alpha.shape != (len(attn.site.kept_groups),):
            raise ValueError(f"{attn.site.name}: gates {tuple(alpha.shape)}, expected "
                             f"({len(attn.site.kept_groups)},)")  # fmt: skip
    mixes = {
        f"{b.attn.site.name}.mix": lambda _, m=a.index_select(0, b.attn.kv_index): m  # [head]
        for b, a in zip(blocks, alphas, strict=True)
    }
    with model.intervene(mixes):
        yield


def mixed_features(model: Transformer, tokens: torch.Tensor, alphas: Sequence[torch.Tensor],
                   sink: int, window: int) -> torch.Tensor:  # fmt: skip
    """The last hidden states [batch, seq, d_model] of the mixed model (the model frozen, so a
    backward reaches only `alphas`)."""
    plan = streaming_plan(model, sink, window)
    with frozen(model), mixing(model, alphas):
        return model.features(tokens, plan=plan)


@dataclass(frozen=True)
class TextPasskey:
    """A passkey prompt in text: frame, text with the passkeys inside, then the questions."""

    tokens: torch.Tensor  # [seq] long
    targets: torch.Tensor  # [k] long: the question-and-answer tail's positions (distilled)
    key_at: tuple[int, ...]  # where each passkey's first token stands in `tokens`
    depths: tuple[float, ...]  # each passkey's depth: the share of the text before it


def text_passkeys(docs: Sequence[str], tokenizer, n: int, length: int, passkeys: int = 2,
                  words: int = 32, seed: int = 0) -> list[TextPasskey]:  # fmt: skip
    """`n` prompts of exactly `length` tokens: a random stretch of `docs` with `passkeys` keys of
    `words` random words at sorted random depths, then a question for each, answered."""
    from probe.measure.memory import check_fits

    check_fits(n * (24 * max(length, 0) + 1024), f"{n:,} duo passkey prompts of {length:,} "
               "tokens", "fewer duo steps or a smaller prompt_tokens")  # fmt: skip

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    text = ids("\n".join(docs))
    head, tail, sep = ids(FRAME[0]), ids(FRAME[1]), ids(SEPARATOR)
    needles = [ids(NEEDLE.format(o)) for o in ORDINALS[:passkeys]]
    questions = [ids(QUESTION.format(o)) for o in ORDINALS[:passkeys]]
    gen = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(n):
        keys = [ids(" " + " ".join(WORDS[i] for i in torch.randint(len(WORDS), (words,),
                                                                     generator=gen).tolist()))
                for _ in range(passkeys)]  # fmt: skip
        inserts = [sep + needle + key + sep for needle, key in zip(needles, keys, strict=True)]
        tail_qa = tail + [t for q, key in zip(questions, keys, strict=True) for t in q + key + sep]
        room = length - len(head) - len(tail_qa) - sum(map(len, inserts))
        _check_room(room, length, len(text), passkeys, words)
        start = int(torch.randint(len(text) - room + 1, (1,), generator=gen))
        hay = text[start : start + room]
        low, high = DEPTHS
        depths = sorted((low + (high - low) * torch.rand(passkeys, generator=gen)).tolist())
        body, key_at, done = list(head), [], 0
        for depth, insert, needle in zip(depths, inserts, needles, strict=True):
            cut = int(room * depth)  # text tokens before this passkey's needle
            body += hay[done:cut]
            key_at.append(len(body) + len(sep) + len(needle))
            body += insert
            done = cut
        body += hay[done:]
        tokens = body + tail_qa
        targets = torch.arange(len(body) + len(tail), len(tokens))  # [k]
        made.append(TextPasskey(torch.tensor(tokens), targets, tuple(key_at), tuple(depths)))
    return made


def _check_room(room: int, length: int, have: int, passkeys: int, words: int) -> None:
    """One line when the passkeys leave less text than they take, or the text is too short."""
    taken = length - room
    if room < taken:
        raise ProbeError(
            f"duo's {length}-token passkey prompts leave {max(room, 0)} tokens of text beside "
            f"{counted(passkeys, 'passkey')} of {words} words with their questions ({taken} "
            f"tokens); use a prompt_tokens of at least {2 * taken} or fewer passkeys."
        )
    if have < room:
        raise ProbeError(
            f"The text is too short for duo's {length}-token passkey prompts ({have} tokens); "
            "give more text or a smaller prompt_tokens."
        )


def passkey_batch(vocab: int, batch: int, length: int, key_len: int, far: int,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Random-token prompts [batch, length] with a passkey of `key_len` random tokens inserted
    at a random depth at least `far` tokens before its repeat, which ends the prompt; returns
    (tokens, answer positions [key_len]: the repeat's, the same in every row)."""
    tokens = torch.randint(0, vocab, (batch, length), generator=gen)
    keys = torch.randint(0, vocab, (batch, key_len), generator=gen)
    answer = torch.arange(length - key_len, length)  # [key_len]
    latest = length - key_len - far - key_len  # the passkey's last possible start
    starts = torch.randint(0, latest + 1, (batch,), generator=gen)  # [batch]
    for row in range(batch):
        s = int(starts[row])
        tokens[row, s : s + key_len] = keys[row]
    tokens[:, answer] = keys
    return tokens, answer


def prompt_length(model: Transformer, sink: int, window: int, key_len: int) -> int:
    """sink + window + 2 passkeys + a gap of a window: every streaming head loses the first copy;
    one line when the model has fewer positions."""
    length = sink + 2 * window + 2 * key_len
    limit = model.cfg.max_positions
    if limit is not None and length > limit:
        raise ProbeError(
            f"duo's passkey prompts need {length} tokens (sink + 2 x window + 2 passkeys) but the "
            f"model has {limit} positions; use a smaller --window (or train_window)."
        )
    return length


def lr_scale(step: int, steps: int, warmup: float) -> float:
    """The learning rate of step `step` (from 0) of `steps`, as a share of the peak: linear
    warm-up over the first `warmup` share of the steps, linear decay over the last as many,
    never below FLOOR (the reference's schedule, whose share is a fifth); 1 without a ramp."""
    ramp = math.floor(steps * warmup + 1e-9)  # the reference: num_steps // 5
    if ramp == 0:
        return 1.0
    return min(1.0, max((step + 1) / ramp, FLOOR), max((steps - step) / ramp, FLOOR))


def undecided(gates: torch.Tensor) -> int:
    """How many gates lie more than SEPARATED from both 0 and 1."""
    return int(((gates > SEPARATED) & (gates < 1 - SEPARATED)).sum())


Batch = tuple[torch.Tensor, list[torch.Tensor]]  # tokens [batch, seq], targets per row [k]


def _batches(model: Transformer, sink: int, window: int, settings, seed: int,
             prompts: Sequence[TextPasskey] | None) -> tuple[Iterator[Batch], dict]:  # fmt: skip
    """The training batches, endless (text prompts in turn, or random-token passkeys drawn from
    `seed`), and what they are, for the notes."""
    if prompts:
        longest, limit = max(len(p.tokens) for p in prompts), model.cfg.max_positions
        if limit is not None and longest > limit:
            raise ProbeError(
                f"duo's {longest}-token passkey prompts are longer than the model's {limit} "
                "positions; use a smaller prompt_tokens."
            )
        shortest = min(len(p.tokens) for p in prompts)
        if sink + window >= shortest:  # the streaming side would see every token: no signal
            raise ProbeError(
                f"duo's streaming side keeps {sink} sink + {window} recent tokens, the whole of "
                f"its {shortest}-token passkey prompts, so the gates would learn nothing; use a "
                "smaller train_window (or --window) or a larger prompt_tokens."
            )

        def text() -> Iterator[Batch]:
            for step in itertools.count():
                rows = [prompts[(step * settings.batch + i) % len(prompts)]
                        for i in range(settings.batch)]  # fmt: skip
                yield torch.stack([p.tokens for p in rows]), [p.targets for p in rows]

        return text(), {"duo_prompts": "passkeys in text", "duo_prompt_tokens": longest,
                        "duo_passkeys": len(prompts[0].key_at)}  # fmt: skip
    length = prompt_length(model, sink, window, settings.key_len)
    far = length - 2 * settings.key_len - sink - window  # gap beyond any streaming head's reach
    gen = torch.Generator().manual_seed(seed)

    def tokens() -> Iterator[Batch]:
        while True:
            rows, answer = passkey_batch(model.cfg.vocab_size, settings.batch, length,
                                         settings.key_len, far, gen)  # fmt: skip
            yield rows, [answer] * settings.batch

    return tokens(), {"duo_prompts": "random tokens", "duo_prompt_tokens": length,
                      "duo_key_len": settings.key_len}  # fmt: skip


def _step(model: Transformer, opt, alphas: list[torch.Tensor], batch: Batch, sink: int,
          window: int, l1: float) -> float:  # fmt: skip
    """One Adam step on the gates (clamped to [0, 1] after it); the distillation loss before."""
    device = alphas[0].device
    tokens, targets = batch[0].to(device), [t.to(device) for t in batch[1]]
    with torch.no_grad():
        ref = model.features(tokens)  # [batch, seq, d_model]
    out = mixed_features(model, tokens, alphas, sink, window)  # [batch, seq, d_model]
    diff = torch.cat([out[i, t].float() - ref[i, t].float() for i, t in enumerate(targets)])
    distill = diff.pow(2).mean(-1).mean()  # diff: [targets of every row, d_model]
    gates = torch.cat(alphas)
    loss = distill + l1 * gates.abs().mean() if gates.numel() else distill
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for a in alphas:
            a.clamp_(0.0, 1.0)
    return float(distill.detach())


def duo_gates(model: Transformer, sink: int, window: int, settings, seed: int = 0,
              prompts: Sequence[TextPasskey] | None = None,
              progress: Callable[[str], None] | None = None
              ) -> tuple[list[torch.Tensor], dict]:  # fmt: skip
    """Per site, the trained gates [kept key/value heads] (float32, in [0, 1]) and notes (the
    prompts, the steps run, whether the gates separated, how many are undecided, their median,
    the distillation loss at the first and last step); `settings`: a
    `probe.kv.methods.duo.DuoSettings`; `prompts`: passkeys in text (None: random tokens)."""
    settings.check()
    say = progress or (lambda _: None)
    sink, window = settings.train_sink or sink, settings.train_window or window
    batches, about = _batches(model, sink, window, settings, seed, prompts)
    device = next(model.parameters()).device
    alphas = [torch.ones(len(b.attn.site.kept_groups), device=device, requires_grad=True)
              for b in model.blocks]  # fmt: skip
    opt = torch.optim.Adam(alphas, lr=settings.lr)
    losses: list[float] = []
    reach, separated, was_training = 0.0, False, model.training
    model.eval()
    try:
        for step in range(settings.steps):
            rate = settings.lr * lr_scale(step, settings.steps, settings.warmup)
            for group in opt.param_groups:
                group["lr"] = rate
            losses.append(_step(model, opt, alphas, next(batches), sink, window, settings.l1))
            reach += rate
            left = undecided(torch.cat(alphas).detach())
            say(f"duo step {step + 1}/{settings.steps}: distillation loss {losses[-1]:.3g}, "
                f"{left} gates undecided")  # fmt: skip
            separated = left == 0 and reach >= 1.0
            if separated:
                break
    finally:
        model.train(was_training)
    gates = torch.cat([a.detach().float() for a in alphas])
    median = float(gates.quantile(0.5)) if gates.numel() else math.nan
    notes = {**about, "duo_batch": settings.batch, "duo_train_sink": sink,
             "duo_train_window": window, "duo_steps_run": len(losses),
             "duo_separated": separated, "duo_undecided": undecided(gates),
             "duo_gate_median": median, "duo_distill_first": losses[0],
             "duo_distill_last": losses[-1]}  # fmt: skip
    return [a.detach().float() for a in alphas], notes
