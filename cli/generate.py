"""`probe generate`: continue a prompt with a decoder, one token a step through the key/value
cache (`probe.measure.generate`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from probe_cli.common import (
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    PickleOpt,
    check_seed,
    console,
    shown,
)
from probe_cli.kv_eval import read_plan
from probe_cli.rope import (
    RopeAlphaOpt,
    RopeFactorOpt,
    RopeOriginalOpt,
    RopeScalingOpt,
    apply_rope,
    rope_request,
)

from probe.errors import ProbeError
from probe.words import counted


def _token_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; anything else is one line."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ProbeError(
            f"--tokens takes comma-separated token ids such as 1,2,3; got '{text}'."
        ) from None
    if not ids:
        raise ProbeError("--tokens is empty: give at least one token id, such as 1,2,3.")
    return ids


def _prompt_ids(ckpt, prompt: str | None, tokens: str | None) -> tuple[list[int], object | None]:
    """The prompt's token ids and the tokenizer that decodes the continuation (None: ids)."""
    if (prompt is None) == (tokens is None):
        raise ProbeError("give the prompt as --prompt TEXT or as --tokens 1,2,3 (one of the two).")
    if tokens is not None:
        return _token_ids(tokens), None
    if not ckpt.imported:
        raise ProbeError(
            f"{ckpt.path} was trained by probe on a synthetic task and has no tokenizer; give "
            "the prompt as token ids with --tokens 1,2,3."
        )
    if not prompt.strip():
        raise ProbeError("--prompt is empty: give some text to continue.")
    tokenizer = ckpt.tokenizer()
    return tokenizer.encode(prompt).ids, tokenizer


def generate_cli(
    checkpoint: CheckpointArg,
    prompt: Annotated[
        str | None, typer.Option("--prompt", help="Text to continue (imported models).")
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option("--tokens", help="The prompt as token ids, '1,2,3' (any decoder)."),
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Tokens to generate.")
    ] = 32,
    greedy: Annotated[
        bool, typer.Option("--greedy", help="Take the most likely token (the default).")
    ] = False,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", help="Sample from softmax(logits / T) instead (T > 0)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampling.")] = 0,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Recompute every step with the full forward; fail if the logits differ by "
            "more than 1e-4 of their scale (bf16/fp16: 8 of the dtype's epsilons).",
        ),
    ] = False,
    kv_plan: Annotated[
        Path | None,
        typer.Option(
            "--kv-plan",
            help="A plan directory (plan.json from probe kv-plan): its streaming heads keep "
            "only the plan's sink and window of the cache.",
        ),
    ] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    rope_scaling: RopeScalingOpt = None,
    rope_factor: RopeFactorOpt = None,
    rope_original: RopeOriginalOpt = None,
    rope_alpha: RopeAlphaOpt = None,
) -> None:
    """Continue a prompt, one token a step through the key/value cache; prints the
    continuation, tokens/s and the cache's bytes."""
    from probe_cli.common import load_model

    if greedy and temperature is not None:
        raise ProbeError("--greedy and --temperature exclude each other; give one.")
    if temperature is not None and not 0 < temperature < float("inf"):
        raise ProbeError(f"--temperature must be above 0 and finite, got {temperature}.")
    check_seed(seed)
    if max_new_tokens < 1:
        raise ProbeError(f"--max-new-tokens must be at least 1, got {max_new_tokens}.")
    rope = rope_request(checkpoint, rope_scaling, rope_factor, rope_original, rope_alpha)
    plan = read_plan(kv_plan) if kv_plan is not None else None  # before the model is loaded
    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    if ckpt.model_cfg.arch != "decoder":
        raise ProbeError(
            f"{shown(checkpoint)} is an {ckpt.model_cfg.arch} model; generation needs a decoder "
            "(a causal language model)."
        )
    ids, tokenizer = _prompt_ids(ckpt, prompt, tokens)
    apply_rope(ckpt, rope)
    vocab = ckpt.model_cfg.vocab_size
    if not all(0 <= i < vocab for i in ids):
        raise ProbeError(
            f"prompt token ids must lie in 0..{vocab - 1} (the model's vocabulary); got "
            f"{min(ids)}..{max(ids)}."
        )
    _run(ckpt, ids, tokenizer, max_new_tokens, temperature, seed, check, plan)


def _run(ckpt, ids, tokenizer, max_new_tokens, temperature, seed, check, plan) -> None:
    import torch

    from probe.measure.generate import generate

    model = ckpt.model
    device = next(model.parameters()).device
    prompt = torch.tensor([ids], dtype=torch.long, device=device)  # [1, prompt]
    cache = model.new_cache(plan)  # a plan is checked against the model here
    start = time.perf_counter()
    with console.status(f"generating {counted(max_new_tokens, 'token')}"):
        out = generate(model, prompt, max_new_tokens, greedy=temperature is None,
                       temperature=temperature or 1.0, seed=seed, check=check,
                       cache=cache, plan=plan)  # fmt: skip
    seconds = time.perf_counter() - start
    new = out[0, len(ids) :].tolist()
    text = tokenizer.decode(new) if tokenizer is not None else ",".join(map(str, new))
    console.print(text, highlight=False, markup=False, soft_wrap=True)
    how = "greedy" if temperature is None else f"temperature {temperature:g}, seed {seed}"
    checked = ", every step checked against the full forward" if check else ""
    if plan is not None:
        checked += f", {plan.method} plan: sink {plan.sink}, window {plan.window}"
    timed = f"prefill of {counted(len(ids), 'token')}"
    timed += " and the full-forward checks" if check else ""
    console.print(
        f"{counted(len(new), 'token')} ({how}{checked}) in {seconds:.2f} s: "
        f"{len(new) / seconds:.1f} tokens/s ({timed} included); "
        f"key/value cache {cache.nbytes:,} bytes for {counted(cache.length, 'token')}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command(
        "generate",
        no_args_is_help=True,
        epilog='Example: probe generate runs/smollm2 --prompt "The capital of France is" '
        "--max-new-tokens 20 --check",
    )(generate_cli)
