"""DuoAttention's retrieval-head gates (Xiao et al., ICLR 2025), on probe's model.

Every key/value head of every causal self-attention site gets a gate alpha in [0, 1]; its query
heads' output is alpha * (full attention) + (1 - alpha) * (streaming attention: the first `sink`
keys and the last `window`: a key/value plan's streaming rule), each site's alphas given at its
`mix` point (`probe.model.points`). With the model frozen, only the gates are optimized (Adam,
clamped to [0, 1] after each step, starting at 1 as DuoAttention does) on synthetic passkey
prompts, so that the mixed model's last hidden states (after the final norm)
at the passkey answer positions match the full model's:

    loss = mean over answer positions of mean_d (h_mixed - h_full)^2 + l1 * mean(alpha)

(DuoAttention's distillation loss and L1 penalty, `reg_weight` there.) Key/value heads with the
largest alpha keep the full cache (`probe.kv.planning.choose_full`).

Differences from the paper's recipe: prompts are token-level passkeys (random tokens with a
random-token passkey inserted early and repeated at the end, the repeat being the answer), not
text haystacks with a worded question; a few dozen steps on a CPU with a constant learning rate
(no warm-up / decay schedule); the streaming heads train with the plan's sink and window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from probe.errors import ProbeError
from probe.kv.plan import KVPlan
from probe.model import Transformer


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
            f"model has {limit} positions; use a smaller --window."
        )
    return length


def duo_gates(model: Transformer, sink: int, window: int, settings, seed: int = 0,
              progress: Callable[[str], None] | None = None
              ) -> tuple[list[torch.Tensor], dict]:  # fmt: skip
    """Per site, the trained gates [kept key/value heads] (float32, in [0, 1]) and notes (prompt
    length, the distillation loss before and after); `settings`: a
    `probe.kv.methods.duo.DuoSettings` (the method's options and the prompts' shape)."""
    settings.check()
    say = progress or (lambda _: None)
    length = prompt_length(model, sink, window, settings.key_len)
    far = length - 2 * settings.key_len - sink - window  # gap beyond any streaming head's reach
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    alphas = [torch.ones(len(b.attn.site.kept_groups), device=device, requires_grad=True)
              for b in model.blocks]  # fmt: skip
    opt = torch.optim.Adam(alphas, lr=settings.lr)
    losses: list[float] = []
    was_training = model.training
    model.eval()
    try:
        for step in range(settings.steps):
            tokens, answer = passkey_batch(model.cfg.vocab_size, settings.batch, length,
                                           settings.key_len, far, gen)  # fmt: skip
            tokens, answer = tokens.to(device), answer.to(device)
            with torch.no_grad():
                ref = model.features(tokens).index_select(1, answer).float()  # [b, key, d]
            out = mixed_features(model, tokens, alphas, sink, window).index_select(1, answer)
            distill = (out.float() - ref).pow(2).mean(-1).mean()
            gates = torch.cat(alphas)
            loss = distill + settings.l1 * gates.abs().mean() if gates.numel() else distill
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for a in alphas:
                    a.clamp_(0.0, 1.0)
            losses.append(float(distill.detach()))
            say(f"duo step {step + 1}/{settings.steps}: distillation loss {losses[-1]:.3g}")
    finally:
        model.train(was_training)
    notes = {"duo_prompt_tokens": length, "duo_batch": settings.batch,
             "duo_key_len": settings.key_len, "duo_distill_first": losses[0],
             "duo_distill_last": losses[-1]}  # fmt: skip
    return [a.detach().float() for a in alphas], notes
