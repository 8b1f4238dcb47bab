"""Cached generation: prefill the prompt through the key/value cache, then feed one token a step,
choosing each next token greedily (argmax) or by sampling at a temperature with an explicit
`torch.Generator`. With `check`, every step is recomputed by the full forward over the whole
sequence and must give the same logits.

A rotary whose frequencies depend on the length (dynamic NTK past the model's context, LongRoPE
at the step that crosses its original context) turns the cached keys by frequencies the next
step would not use; that step then prefills the whole sequence again, so every step computes
what the full forward computes at its length. (transformers keeps the cached keys of dynamic
NTK as they were rotated, and for LongRoPE discards its cache the first time the switch is
crossed; probe's cached logits equal its full forward's at every step instead.)

A caller may pass a prepared `cache` (for instance one cut per head by a KV plan); the default is
the model's own full cache, `model.new_cache()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from probe.config import Arch
from probe.errors import ProbeError
from probe.model import Transformer
from probe.model.cache import KVCache
from probe.model.positional import rotary_changes

CHECK_TOLERANCE = 1e-4  # float32: |cached - full| <= 1e-4 x max(1, max |full logit|)
HALF_ULPS = 8  # bf16 / fp16: 8 machine epsilons of the dtype (bf16 0.0625, fp16 0.0078) x scale


def check_tolerance(dtype: torch.dtype) -> float:
    """The largest relative logit gap `check` accepts for weights of `dtype`: 1e-4 in float32
    (and float64); a half dtype rounds every activation of two separate passes differently, so
    it gets 8 of its own machine epsilons (bf16: 0.0625, fp16: 0.0078)."""
    if dtype in (torch.float32, torch.float64):
        return CHECK_TOLERANCE
    return max(CHECK_TOLERANCE, HALF_ULPS * torch.finfo(dtype).eps)


def check_request(
    model: Transformer, tokens: torch.Tensor, max_new_tokens: int, greedy: bool, temperature: float
) -> None:
    """One line for what generation cannot do: an encoder, an empty prompt, no new tokens, a
    temperature that is not positive, or a sequence longer than a learned position table."""
    cfg = model.cfg
    if cfg.arch != Arch.DECODER:
        raise ProbeError(
            f"generation needs a decoder (a causal language model); this model is an {cfg.arch}."
        )
    if tokens.dim() != 2 or tokens.shape[1] == 0:
        raise ProbeError("the prompt is empty: give at least one token to continue.")
    if max_new_tokens < 1:
        raise ProbeError(f"--max-new-tokens must be at least 1, got {max_new_tokens}.")
    if not greedy and not temperature > 0:
        raise ProbeError(f"--temperature must be above 0, got {temperature}; use --greedy.")
    limit = cfg.max_positions
    if limit is not None and tokens.shape[1] + max_new_tokens > limit:
        raise ProbeError(
            f"the prompt ({tokens.shape[1]} tokens) and {max_new_tokens} new tokens exceed the "
            f"model's {limit} learned positions; ask for fewer tokens."
        )
    if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
        raise ProbeError(
            f"prompt token ids must lie in 0..{cfg.vocab_size - 1} (the model's vocabulary); "
            f"got {int(tokens.min())}..{int(tokens.max())}."
        )


def check_memory(model: Transformer, tokens: torch.Tensor, max_new_tokens: int, check: bool,
                 plan: Any = None) -> None:  # fmt: skip
    """One line, before anything is allocated, when the cache of prompt + new tokens (a plan's
    streaming heads: at most sink + window + 1 of them) and the prefill's forward pass (with
    `check`, the full forward over the whole sequence) would not fit in memory."""
    from probe.measure.memory import check_fits, forward_bytes

    cfg = model.cfg
    batch, prompt = tokens.shape
    total = prompt + max_new_tokens
    size = next(model.parameters()).dtype.itemsize
    rows = 0  # cached positions summed over every site's key/value heads
    for i, site in enumerate(cfg.sites()):
        full = site.kept_groups if plan is None else plan.full[i]
        stream = len(site.kept_groups) - len(full)
        rows += len(full) * total + stream * min(total, plan.sink + plan.window + 1 if plan else 0)
    cache = 2 * 2 * batch * rows * (cfg.d_head or 0) * size  # k and v; a step's cat copies them
    forward = forward_bytes(cfg, batch, total if check else prompt, dtype=model.embed.weight.dtype)
    check_fits(cache + forward, f"{batch * total:,} tokens of generation ({prompt:,} prompt and "
               f"{max_new_tokens:,} new{', each step checked' if check else ''})",
               "fewer --max-new-tokens or a shorter prompt")  # fmt: skip


def _compare(
    model: Transformer, seq: torch.Tensor, cached: torch.Tensor, step: int, plan=None
) -> None:
    """The full forward over seq [batch, len] (with the cache's `plan` masked) must give the
    cached logits [batch, new, vocab] at its last `new` positions; otherwise a ProbeError naming
    the step."""
    full = model(seq, plan=plan)[:, -cached.shape[1] :].float()  # [batch, new, vocab]
    gap = float((cached.float() - full).abs().max())
    scale = max(1.0, float(full.abs().max()))
    tol = check_tolerance(cached.dtype)
    if not gap <= tol * scale:  # also catches NaN
        what = "the prefill" if step == 0 else f"step {step}"
        raise ProbeError(
            f"cached decoding differs from the full forward at {what} (sequence length "
            f"{seq.shape[1]}): max |logit gap| {gap:.3g} > {tol:g} x scale {scale:.3g}."
        )


def _next(
    logits: torch.Tensor, greedy: bool, temperature: float, generator: torch.Generator | None
) -> torch.Tensor:
    """logits [batch, vocab] -> next tokens [batch, 1]."""
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)  # [batch, 1]
    # shifted so the top logit is 0 before dividing: a tiny temperature then sends the others
    # to -inf (probability 0) instead of every logit to +-inf (NaN probabilities)
    shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)  # [batch, vocab]
    probs = torch.softmax(shifted / temperature, dim=-1)  # [batch, vocab]
    return torch.multinomial(probs, 1, generator=generator)  # [batch, 1]


@torch.no_grad()
def generate(
    model: Transformer,
    tokens: torch.Tensor,
    max_new_tokens: int,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    check: bool = False,
    eos: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cache: KVCache | None = None,
    plan: Any = None,
) -> torch.Tensor:
    """tokens [batch, prompt] (no padding) -> [batch, prompt + new]: the prompt and up to
    `max_new_tokens` tokens decoded through the key/value cache.

    greedy takes the argmax; otherwise each token is drawn from softmax(logits / temperature)
    with a generator seeded by `seed` on the model's device. `eos`: a row that produced it
    repeats it, and decoding stops once every row has (so fewer than max_new_tokens may
    return). `check`: every step also runs the full forward on the whole sequence and raises a
    ProbeError naming the step when the logits differ by more than `check_tolerance(dtype)`
    relative to their scale. `progress(done, total)` after every new token. `cache`: an empty
    prepared cache (a KV plan's, say) to decode into; default `model.new_cache()`, filled in
    place, so a caller that passes one can read its `nbytes` afterwards. `plan`: a
    `probe.kv.plan.KVPlan` to decode with (the cache is `model.new_cache(plan)`, whose streaming
    heads keep only its sink and window; `check` then compares with the full forward under the
    same plan, which computes the same function)."""
    check_request(model, tokens, max_new_tokens, greedy, temperature)
    if cache is None:
        cache = model.new_cache(plan)  # empty: allocates nothing yet (and checks the plan)
    elif cache.length:
        raise ProbeError(f"the cache given already holds {cache.length} tokens; pass an empty one.")
    check_memory(model, tokens, max_new_tokens, check, cache.plan)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    generator = None if greedy else torch.Generator(device=device).manual_seed(seed)
    seq = tokens
    hidden = model.features(tokens, cache=cache)  # [batch, prompt, d_model]
    if check:  # every prompt position's logits
        logits = model.logits(hidden)  # [batch, prompt, vocab]
        _compare(model, seq, logits, 0, cache.plan)
    else:  # only the last one chooses a token
        logits = model.logits(hidden[:, -1:])  # [batch, 1, vocab]
    done = torch.zeros(tokens.shape[0], 1, dtype=torch.bool, device=device)  # [batch, 1]
    for step in range(1, max_new_tokens + 1):
        nxt = _next(logits[:, -1], greedy, temperature, generator)  # [batch, 1]
        if eos is not None:
            nxt = nxt.masked_fill(done, eos)
            done = done | (nxt == eos)
        seq = torch.cat([seq, nxt], dim=1)  # [batch, prompt + step]
        if progress is not None:
            progress(step, max_new_tokens)
        if step == max_new_tokens or (eos is not None and bool(done.all())):
            break
        if rotary_changes(model, seq.shape[1] - 1, seq.shape[1]):  # dynamic, longrope
            cache.clear()  # its keys turned by other frequencies: prefill the whole sequence
            logits = model.logits(model.features(seq, cache=cache)[:, -1:])  # [batch, 1, vocab]
        else:
            logits = model(nxt, cache=cache)  # [batch, 1, vocab]
        if check:
            _compare(model, seq, logits, step, cache.plan)
    return seq
