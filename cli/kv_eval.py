"""`probe eval CKPT --kv-plan DIR`: an imported language model's loss and needle accuracy with a
key/value plan applied, and the key/value bytes its cache really allocated, beside the full
cache's (a thin shell over `probe.kv.evaluate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from probe_cli.common import check_data_fits, console, note_text, shown, write_manifest
from rich.table import Table

from probe.errors import ProbeError

KVPlanOpt = Annotated[
    Path | None,
    typer.Option(
        "--kv-plan",
        help="Imported language models: a plan directory (plan.json from probe kv-plan); "
        "evaluates loss, needle accuracy and key/value bytes with the plan and the full cache.",
    ),
]
NeedleTokensOpt = Annotated[
    int | None,
    typer.Option("--needle-tokens", help="With --kv-plan: tokens per needle prompt (1024)."),
]
NeedlesOpt = Annotated[
    int | None, typer.Option("--needles", help="With --kv-plan: needle prompts (3).")
]
PrefillOpt = Annotated[
    str | None,
    typer.Option(
        "--prefill",
        help="With --kv-plan: how a needle prompt enters the plan's cache: full (full attention "
        "over the prompt, then the streaming heads cut, as DuoAttention and RazorAttention "
        "prefill; default), chunked or chunked:N (N tokens a call, cut after each; 1024), or "
        "masked (streaming heads see only sink + window at every position, StreamingLLM's).",
    ),
]
NEEDLE_TOKENS, NEEDLES = 1024, 3


def check_needle_options(plan: Path | None, needle_tokens: int | None, needles: int | None,
                         prefill: str | None = None) -> None:  # fmt: skip
    """--needles, --needle-tokens and --prefill only mean something with --kv-plan (one line
    otherwise); --prefill is read now."""
    if plan is None and (needle_tokens is not None or needles is not None or prefill):
        raise ProbeError("--needles, --needle-tokens and --prefill set the needle prompts of "
                         "--kv-plan; give a plan with --kv-plan DIR or leave them "
                         "out.")  # fmt: skip
    parse_prefill(prefill)


def parse_prefill(text: str | None):
    """--prefill's value as a `probe.kv.evaluate.Prefill` ("chunked:512": chunks of 512)."""
    from probe.kv.plan import MAX_TOKENS, PREFILLS, Prefill

    if not text:
        return Prefill()
    mode, colon, chunk = text.partition(":")
    if mode not in PREFILLS or (colon and mode != "chunked"):
        raise ProbeError(f"--prefill must be full, chunked, chunked:N or masked, got {text!r}.")
    if not colon:
        return Prefill(mode)
    if not (chunk.isascii() and chunk.isdigit()) or not 1 <= int(chunk) <= MAX_TOKENS:
        raise ProbeError(f"--prefill chunked:N needs N, tokens per call, from 1 to 2**40; "
                         f"got {chunk!r}.")  # fmt: skip
    return Prefill(mode, int(chunk))


def read_plan(path: Path):
    """The plan at `path`, read before any model is loaded (one line when it is bad)."""
    from probe.kv.plan import KVPlan

    return KVPlan.read(path)


def eval_kv_plan(ckpt, plan, out, earlier, lengths, text, whole, batch_size, batches, seed,
                 max_batch_tokens, needle_tokens, needles, prefill=None) -> None:  # fmt: skip
    from probe.analysis.retrieval import needle_prompts
    from probe.data.tasks import parse_lengths
    from probe.data.text import read_documents
    from probe.files import open_output
    from probe.kv.evaluate import evaluate_plan, saved
    from probe.report.files import atomic_write_csv

    needle_tokens = NEEDLE_TOKENS if needle_tokens is None else needle_tokens
    needles = NEEDLES if needles is None else needles
    prefill = parse_prefill(prefill)
    ckpt.model.stream_rules(plan)  # one line when the plan is not this model's
    if not ckpt.imported or ckpt.objective != "causal-lm":
        raise ProbeError(
            f"--kv-plan needs an imported causal language model (text and needle prompts); "
            f"{ckpt.path} is not one."
        )
    if needles < 1 or needle_tokens < 1:
        raise ProbeError(f"--needles and --needle-tokens must be >= 1, got {needles} and "
                         f"{needle_tokens}.")  # fmt: skip
    limit = ckpt.model_cfg.max_positions
    if limit is not None and needle_tokens > limit:
        raise ProbeError(
            f"--needle-tokens {needle_tokens} is longer than the model's {limit} learned "
            f"positions; use --needle-tokens {limit} or less."
        )
    widths = parse_lengths(lengths or "128")
    check_data_fits(ckpt, widths, batch_size, batches, max_batch_tokens=max_batch_tokens)
    note_text(text)
    docs = read_documents(text, whole=whole)
    tokenizer = ckpt.tokenizer()
    prompts = needle_prompts(docs, tokenizer, needles, needle_tokens, seed=seed)
    table = evaluate_plan(ckpt.model, plan, tokenizer, docs, widths, prompts, batch_size,
                          batches, seed, max_batch_tokens, prefill)  # fmt: skip
    open_output(out, earlier)
    atomic_write_csv(out / "eval.csv", table)
    write_manifest(out, ckpt, command="eval", lengths=widths, batch_size=batch_size,
                   batches=batches, seed=seed, text=str(text) if text else "shipped corpus",
                   whole=whole, max_batch_tokens=max_batch_tokens, kv_plan=plan.to_dict(),
                   needle_tokens=needle_tokens, needles=needles,
                   prefill={"mode": prefill.mode, "chunk": prefill.chunk})  # fmt: skip
    view = Table(title=f"key/value plan ({plan.method}, sink {plan.sink}, window {plan.window}, "
                       f"{prefill.mode} prefill)")  # fmt: skip
    for col in ("metric", "tokens", "plan", "full cache"):
        view.add_column(col, justify="right")
    wide = table.pivot_table(index=["metric", "length"], columns="cache", values="value")
    for (metric, length), row in wide.iterrows():
        fmt = "{:,.0f}" if metric.startswith("kv_") else "{:.4f}"
        view.add_row(metric, str(length), fmt.format(row.plan), fmt.format(row.full))
    console.print(view)
    for length, share in saved(table).items():
        console.print(f"key/value cache saved at {length} tokens: [bold]{share:.1%}[/]")
    console.print(f"wrote {shown(out / 'eval.csv')}")
