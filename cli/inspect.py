"""`probe inspect`: per-head attention statistics and roles of a checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from probe_cli.common import (
    BatchSizeOpt,
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    MaxBatchTokensOpt,
    OutOpt,
    OverwriteOpt,
    PickleOpt,
    SeedOpt,
    TextOpt,
    WholeOpt,
    check_data_fits,
    check_data_options,
    check_positive,
    console,
    describe,
    fmt_stat,
    inputs_of,
    load_model,
    note_text,
    require_heads,
    shown,
    stats_progress,
    text_data,
)
from probe_cli.rope import (
    RopeAlphaOpt,
    RopeFactorOpt,
    RopeOriginalOpt,
    RopeScalingOpt,
    apply_rope,
    rope_request,
)
from rich.table import Table

from probe import provenance
from probe.data.task_spec import parse_lengths
from probe.errors import ProbeError
from probe.files import claim_output, open_output
from probe.measure.batching import DEFAULT_BATCH_TOKENS
from probe.words import counted

if TYPE_CHECKING:
    import pandas as pd

STREAMING = {"auto": "auto", "on": True, "off": False}


def inspect_cli(
    checkpoint: CheckpointArg,
    out: OutOpt,
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            help="Task lengths: 'lo:hi' (inclusive) or '8,16,32' (default 8,16,32); imported "
            "models: tokens per row of text, e.g. '64,128' (default 128).",
        ),
    ] = None,
    text: TextOpt = None,
    whole: WholeOpt = False,
    needles: Annotated[
        int | None,
        typer.Option(
            help="Imported language models: needle-in-a-haystack prompts for the retrieval-head "
            "score (Wu et al. 2024), as long as the longest --lengths, at least 64 tokens "
            "(default 4; 0: skip)."
        ),
    ] = None,
    batch_size: BatchSizeOpt = 32,
    batches: Annotated[int, typer.Option(help="Batches per length.")] = 2,
    max_batch_tokens: MaxBatchTokensOpt = DEFAULT_BATCH_TOKENS,
    streaming: Annotated[
        str, typer.Option(help="Key tiles with an online softmax: auto (long inputs), on, off.")
    ] = "auto",
    period: Annotated[
        int | None,
        typer.Option(
            help="Repeated-sequence period for the induction score (default: the longest length)."
        ),
    ] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
    rope_scaling: RopeScalingOpt = None,
    rope_factor: RopeFactorOpt = None,
    rope_original: RopeOriginalOpt = None,
    rope_alpha: RopeAlphaOpt = None,
) -> None:
    """Per-head attention statistics and head roles of a checkpoint at several lengths.

    Writes OUT/attention_stats.{csv,parquet}, OUT/roles.{csv,parquet}, heatmaps of normalized
    entropy and max logit, entropy against length per head, and role scores."""
    if streaming not in STREAMING:
        raise ProbeError(f"--streaming must be auto, on or off, got '{streaming}'.")
    check_positive(batch_size=batch_size, batches=batches, max_batch_tokens=max_batch_tokens,
                   **({} if period is None else {"period": period}))  # fmt: skip
    if lengths:
        parse_lengths(lengths)  # task lengths or tokens per row: the same form, checked now
    rope = rope_request(checkpoint, rope_scaling, rope_factor, rope_original, rope_alpha)
    writes = ("attention_stats.csv", "roles.csv", "manifest.json")
    earlier = claim_output(out, writes, overwrite, inputs=inputs_of(checkpoint, text),
                           inside_ok=True)  # fmt: skip
    import pandas as pd

    from probe.analysis.attention import head_summary, inspect_batches, inspect_model
    from probe.report.attention_plots import write_inspection

    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    require_heads(ckpt)
    rope_used = apply_rope(ckpt, rope)
    if not ckpt.imported and text is not None:
        check_data_options(ckpt, text, None)
    wanted = parse_lengths(lengths or ("128" if ckpt.imported else "8,16,32"))
    check_data_fits(ckpt, wanted, batch_size, batches, max_batch_tokens=max_batch_tokens)
    if period is not None:  # the induction score runs sequences of two periods
        from probe.measure.memory import check_batches

        check_batches(ckpt.model_cfg, 1, batch_size, 2 * period, smaller="a smaller --period",
                      max_batch_tokens=max_batch_tokens)  # fmt: skip
    data = None
    if ckpt.imported:
        note_text(text)
        data = {
            n: text_data(ckpt, text, whole, n, batch_size, batches, seed, 0, False, "--lengths")[1]
            for n in wanted
        }
    with stats_progress() as bar:
        jobs: dict[str, int] = {}

        def show(stage: str, done: int, total: int) -> None:
            if stage not in jobs:
                jobs[stage] = bar.add_task(stage, total=total, note="")
            bar.update(jobs[stage], completed=done, total=total)

        if data is not None:
            result = inspect_batches(
                ckpt.model, [b for n in wanted for b in data[n]], wanted, seed=seed,
                streaming=STREAMING[streaming], period=period, progress=show,
                max_batch_tokens=max_batch_tokens,
            )  # fmt: skip
        else:
            result = inspect_model(
                ckpt.model, ckpt.task, wanted, batch_size=batch_size, n_batches=batches, seed=seed,
                streaming=STREAMING[streaming], period=period, progress=show,
                max_batch_tokens=max_batch_tokens,
            )  # fmt: skip
    needles = _needles(ckpt, needles)
    if needles:
        with console.status(f"retrieval heads: {counted(needles, 'needle prompt')}"):
            result.roles = pd.concat(
                [
                    result.roles,
                    _retrieval(ckpt, text, whole, needles, _context(ckpt, wanted), seed),
                ],
                ignore_index=True,
            )
    manifest = {
        "command": "inspect",
        "needle_prompts": needles,
        "checkpoint": str(checkpoint),
        "lengths": result.lengths,
        "batch_size": batch_size,
        "batches": batches,
        "max_batch_tokens": max_batch_tokens,
        "seed": seed,
        "streaming": streaming,
        "induction_period": result.period,
        "model": ckpt.model_cfg.to_dict(),
        "rope_scaling": rope_used,  # what the model ran with instead of its own (None: its own)
        **describe(ckpt),
        **({"text": str(text) if text else "shipped corpus", "whole": whole} if data else {}),
        **provenance.context(model=ckpt.model),
    }
    open_output(out, earlier)
    written = write_inspection(result.stats, result.roles, out, manifest)
    _show_summary(head_summary(result.stats, result.roles), ckpt, result.lengths)
    console.print(
        f"wrote {counted(len(written), 'file')} to {shown(out)}: "
        + ", ".join(p.name for p in written)
    )


def _needles(ckpt, needles: int | None) -> int:
    """How many retrieval prompts: only imported causal language models have them."""
    if ckpt.objective == "causal-lm":
        return 4 if needles is None else needles
    if needles:
        raise ProbeError("--needles needs an imported causal language model (probe import).")
    return 0


def _context(ckpt, wanted: list[int]) -> int:
    """Needle prompts as long as the longest inspected rows, at least 64 tokens, within a
    learned position table."""
    limit = ckpt.model_cfg.max_positions
    return min(max(max(wanted), 64), limit if limit is not None else 1 << 30)


def _retrieval(ckpt, text, whole, needles: int, context: int, seed: int) -> pd.DataFrame:
    from probe.analysis.retrieval import needle_prompts, retrieval_scores
    from probe.data.text import read_documents

    docs = read_documents(text, whole=whole)
    try:
        prompts = needle_prompts(docs, ckpt.tokenizer(), needles, context, seed=seed)
    except ProbeError as exc:  # say how to go on without them
        raise ProbeError(f"{exc} (--needles 0 turns the needle prompts off.)") from None
    return retrieval_scores(ckpt.model, prompts)


def short_site(site: str) -> str:
    """blocks.0.attn -> 0 self; encoder.1.attn -> enc 1 self; decoder.0.cross -> dec 0 cross."""
    part, index, kind = site.split(".")
    prefix = {"blocks": "", "encoder": "enc ", "decoder": "dec "}.get(part, part + " ")
    return f"{prefix}{index} {'self' if kind == 'attn' else kind}"


ROLE_SHORT = {
    "previous_token": "prev",
    "induction": "induct",
    "positional": "offset",
    "sink": "sink",
    "retrieval": "retr",
}


def _show_summary(summary, ckpt, lengths) -> None:
    cfg = ckpt.model_cfg
    at = ", ".join(map(str, lengths))
    if ckpt.imported:
        title = f"imported {ckpt.source['model_type']} ({cfg.pe}); text rows of {at} tokens"
    else:
        lo, hi = ckpt.train_cfg.train_len
        title = f"{ckpt.task.name}, {cfg.arch} ({cfg.pe}), trained on lengths {lo}-{hi}; "
        title += f"inspected at {at}"
    view = Table(title=title, title_justify="left")
    for col in ("layer", "head", "H/logn", "dH/dlnL", "maxlogit", "p_max", "sink", "top role"):
        view.add_column(col, justify="left" if col in ("layer", "top role") else "right")
    for r in summary.itertuples():
        low = r.normalized_entropy == r.normalized_entropy and r.normalized_entropy < 0.3
        entropy = (
            f"[bold red]{fmt_stat(r.normalized_entropy)}[/]"
            if low
            else fmt_stat(r.normalized_entropy)
        )
        hot = r.max_logit == r.max_logit and r.max_logit > 30
        logit = f"[bold red]{fmt_stat(r.max_logit, 1)}[/]" if hot else fmt_stat(r.max_logit, 1)
        role = "-"
        if isinstance(r.role, str):
            role = ROLE_SHORT.get(r.role, r.role)
            if r.role_offset == r.role_offset and r.role_offset is not None:
                role += f" {int(r.role_offset):+d}"
            role += f" {fmt_stat(r.role_score)}"
        view.add_row(
            short_site(r.site),
            str(r.head),
            entropy,
            fmt_stat(r.entropy_slope),
            logit,
            fmt_stat(r.p_max),
            fmt_stat(r.sink_mass),
            role,
        )
    console.print(view)
    console.print(
        "H/logn: mean normalized entropy over lengths; dH/dlnL: slope of entropy against "
        "log length (1: spreads over all it sees, 0: keeps its focus); maxlogit: the "
        "largest logit at any length. Red: entropy collapse (< 0.3) or logits > 30.",
        style="dim",
    )


def register(app: typer.Typer) -> None:
    app.command(
        "inspect",
        no_args_is_help=True,
        epilog="Example: probe inspect runs/copy --lengths 8,16,32 --out runs/copy/inspect",
    )(inspect_cli)
