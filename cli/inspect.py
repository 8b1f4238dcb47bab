"""`probe inspect` (per-head attention statistics and roles of a checkpoint) and `probe scaling`
(why scores are divided by sqrt(d_k), with numbers)."""

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
    inputs_of,
    load_model,
    note_text,
    require_heads,
    shown,
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
from probe_cli.train import parse_range
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
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


def _progress() -> Progress:
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=True)


def _ints(spec: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ProbeError(
            f"{what} must be whole numbers separated by commas, got '{spec}'."
        ) from None
    if not values or min(values) < 1:
        raise ProbeError(
            f"{what} must be positive whole numbers separated by commas, got '{spec}'."
        )
    return values


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


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
    with _progress() as bar:
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
            f"[bold red]{_fmt(r.normalized_entropy)}[/]" if low else _fmt(r.normalized_entropy)
        )
        hot = r.max_logit == r.max_logit and r.max_logit > 30
        logit = f"[bold red]{_fmt(r.max_logit, 1)}[/]" if hot else _fmt(r.max_logit, 1)
        role = "-"
        if isinstance(r.role, str):
            role = ROLE_SHORT.get(r.role, r.role)
            if r.role_offset == r.role_offset and r.role_offset is not None:
                role += f" {int(r.role_offset):+d}"
            role += f" {_fmt(r.role_score)}"
        view.add_row(
            short_site(r.site),
            str(r.head),
            entropy,
            _fmt(r.entropy_slope),
            logit,
            _fmt(r.p_max),
            _fmt(r.sink_mass),
            role,
        )
    console.print(view)
    console.print(
        "H/logn: mean normalized entropy over lengths; dH/dlnL: slope of entropy against "
        "log length (1: spreads over all it sees, 0: keeps its focus); maxlogit: the "
        "largest logit at any length. Red: entropy collapse (< 0.3) or logits > 30.",
        style="dim",
    )


def scaling_cli(
    out: OutOpt,
    steps: Annotated[
        int, typer.Option(help="Training steps per scale in part 2 (0: skip training).")
    ] = 300,
    d_k: Annotated[int, typer.Option("--d-k", help="Head width of the trained models.")] = 256,
    d_ks: Annotated[
        str, typer.Option("--d-ks", help="Head widths at initialization.")
    ] = "8,16,32,64,128,256,512",  # probe.analysis.scaling.D_KS (a test keeps them equal)
    ns: Annotated[
        str, typer.Option("--ns", help="Numbers of keys at initialization.")
    ] = "128,1024",  # probe.analysis.scaling.NS
    queries: Annotated[
        int, typer.Option(help="Random queries per setting at initialization.")
    ] = 512,
    stats_every: Annotated[
        int, typer.Option(help="Steps between attention statistics in training.")
    ] = 25,
    train_len: Annotated[
        str, typer.Option(help="Copy-task lengths to train on, 'lo:hi'.")
    ] = "4:16",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    overwrite: OverwriteOpt = False,
) -> None:
    """Reproduce the paper's argument for 1/sqrt(d_k): score variance, entropy and saturation at
    initialization for each d_k and n, then loss and entropy curves of models trained identical
    but for the scale. Writes OUT/scaling.csv, OUT/scaling_training.csv and plots."""
    if steps < 0:
        raise ProbeError(f"--steps must be 0 (skip training) or more, got {steps}.")
    check_positive(queries=queries, stats_every=stats_every, d_k=d_k)
    widths, lengths = _ints(d_ks, "--d-ks"), _ints(ns, "--ns")
    lo, hi = parse_range(train_len, "--train-len") if steps else (0, 0)
    earlier = claim_output(out, ("scaling.csv", "scaling_training.csv", "manifest.json"), overwrite)
    from probe.analysis.scaling import SCALES, init_scaling, train_scaling
    from probe.report.attention_plots import write_scaling
    from probe.training.train import resolve_device

    used = resolve_device(device)  # checked even when nothing is trained
    init = init_scaling(widths, lengths, SCALES, n_queries=queries, seed=seed)
    curves = None
    if steps:
        with _progress() as bar:
            jobs = {s: bar.add_task(f"train scale {s}", total=steps, note="") for s in SCALES}

            def show(scale: str, p) -> None:
                bar.update(jobs[scale], completed=p.step, note=f"loss {p.loss:.3f}")

            curves = train_scaling(
                d_k,
                SCALES,
                steps=steps,
                stats_every=stats_every,
                train_len=(lo, hi),
                seed=seed,
                device=str(used),
                progress=show,
            )
    manifest = {
        "command": "scaling",
        "d_ks": d_ks,
        "ns": ns,
        "queries": queries,
        "steps": steps,
        "d_k": d_k,
        "stats_every": stats_every,
        "train_len": train_len,
        "seed": seed,
        **provenance.context(used if steps else "cpu"),  # initialization runs on the CPU
    }
    open_output(out, earlier)
    written = write_scaling(init, curves, out, manifest)
    _show_scaling(init, curves)
    console.print(
        f"wrote {counted(len(written), 'file')} to {shown(out)}: "
        + ", ".join(p.name for p in written)
    )


def _show_scaling(init, curves) -> None:
    wide = init.pivot_table(index=["d_k", "n"], columns=["statistic", "scale"], values="value")
    view = Table(
        title="q, k ~ N(0, I) at initialization (variance predicted: d_k unscaled, 1 scaled)",
        title_justify="left",
    )
    for col in (
        "d_k",
        "n",
        "var 1",
        "var 1/sqrt",
        "H/logn 1",
        "H/logn 1/sqrt",
        "H/logn 1/d",
        "p_max>.9 1",
    ):
        view.add_column(col, justify="right")
    for (d, n), r in wide.iterrows():
        view.add_row(
            str(d),
            str(n),
            f"{r[('score_var', 'none')]:.3g}",
            f"{r[('score_var', 'sqrt')]:.3g}",
            f"{r[('normalized_entropy', 'none')]:.3f}",
            f"{r[('normalized_entropy', 'sqrt')]:.3f}",
            f"{r[('normalized_entropy', 'inverse')]:.3f}",
            f"{r[('p_max_gt_0.9', 'none')]:.2f}",
        )
    console.print(view)
    if curves is None:
        return
    view = Table(title="training, identical but for the scale (last logged step)")
    for col in ("scale", "loss", "exact match", "H / log n", "max logit"):
        view.add_column(col, justify="right")
    for scale, part in curves.groupby("scale", sort=False):
        last = part[part.step == part[part.statistic == "normalized_entropy"].step.max()]

        def value(stat, how="mean", part=part, last=last):
            rows = part if stat in ("loss", "exact_match") else last
            rows = rows[rows.statistic == stat]
            if rows.empty:
                return float("nan")
            if stat in ("loss", "exact_match"):
                return float(rows.sort_values("step").value.iloc[-1])
            return float(getattr(rows.value, how)())

        view.add_row(
            scale,
            _fmt(value("loss"), 3),
            _fmt(value("exact_match")),
            _fmt(value("normalized_entropy")),
            _fmt(value("max_logit", "max"), 1),
        )
    console.print(view)


def register(app: typer.Typer) -> None:
    app.command(
        "inspect",
        no_args_is_help=True,
        epilog="Example: probe inspect runs/copy --lengths 8,16,32 --out runs/copy/inspect",
    )(inspect_cli)
    app.command(
        "scaling",
        no_args_is_help=True,
        epilog="Example: probe scaling --steps 0 --out runs/scaling",
    )(scaling_cli)
