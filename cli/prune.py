"""`probe prune`: removing heads for real (a smaller checkpoint), or the pruning curve."""

from __future__ import annotations

from typing import Annotated

import typer
from probe_cli.common import (
    BatchSizeOpt,
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    MaxBatchTokensOpt,
    MaxTokensOpt,
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
    inputs_of,
    load_model,
    require_heads,
    shown,
    write_manifest,
)
from probe_cli.preflight import share_given
from probe_cli.prune_output import report
from probe_cli.selection import (
    BatchesOpt,
    LengthsOpt,
    NormalizeOpt,
    check_data,
    data_name,
    phased,
    progress_bar,
)
from rich.table import Table

from probe.checkpoint_files import CHECKPOINT_FILES
from probe.data.task_spec import parse_lengths
from probe.errors import ProbeError
from probe.files import claim_output, open_output
from probe.measure.batching import DEFAULT_BATCH_TOKENS
from probe.pruning import run
from probe.pruning.choices import ESTIMATORS, Unit
from probe.words import counted

SWEEP_FILES = ("pruning.csv", "pruning.png", "pruning_loss.png", "manifest.json")


def _fractions(spec: str | None) -> list[float] | None:
    if not spec:
        return None
    try:
        values = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ProbeError(f"--fractions must be numbers like '0,0.25,0.5', got '{spec}'.") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise ProbeError(f"--fractions must be numbers between 0 and 1, got '{spec}'.")
    return values


def _sweep(ckpt, out, earlier, methods: str, seeds: int, fractions: str | None, data: run.Data,
           options: dict) -> None:  # fmt: skip
    """`probe.pruning.run.sweep`, its curve written, plotted and shown as a table."""
    from probe.report.files import atomic_save_figure, atomic_write_csv
    from probe.report.pruning_plots import pruning_curve_plot

    asked = run.sweep_methods(methods)
    if run.with_baseline(asked) != asked:
        console.print("adding the random baseline to the sweep")
    check_data(ckpt, data, seeds, options["max_batch_tokens"])
    with progress_bar() as bar:
        job = bar.add_task("sweep", total=None)
        result = run.sweep(ckpt, asked, seeds=seeds, fractions=_fractions(fractions), data=data,
                           progress=lambda d, t: bar.update(job, completed=d, total=t),
                           **options)  # fmt: skip
    curve, metric = result.curve, result.metric
    open_output(out, earlier)
    atomic_write_csv(out / "pruning.csv", curve)
    title = f"{data_name(ckpt)}, {ckpt.model_cfg.arch}: heads pruned by importance"
    atomic_save_figure(out / "pruning.png", pruning_curve_plot(curve, metric, title))
    second = "loss" if metric != "loss" else "perplexity"
    if second in set(curve.metric):  # a sentence encoder has only its similarity
        atomic_save_figure(out / "pruning_loss.png", pruning_curve_plot(curve, second, title))
    mean = curve[curve.metric == metric].groupby(["fraction", "method"])["value"].mean()
    wide = mean.unstack("method")
    view = Table(title=f"{metric} (mean over {counted(seeds, 'seed')}) vs fraction of heads pruned")
    view.add_column("fraction", justify="right")
    for m in wide.columns:
        view.add_column(m, justify="right")
    for f, row in wide.iterrows():
        view.add_row(f"{f:.2f}", *(f"{v:.3f}" for v in row))
    console.print(view)
    console.print(f"wrote {shown(out / 'pruning.csv')} and {shown(out / 'pruning.png')}")
    write_manifest(out, ckpt, command="prune --sweep", **result.settings)


def prune_cli(
    checkpoint: CheckpointArg,
    out: OutOpt,
    fraction: Annotated[
        float, typer.Option(help="Share of the heads to remove, 0-1.", callback=share_given)
    ] = 0.5,
    method: Annotated[
        str,
        typer.Option(
            help=f"Importance estimator that ranks the heads: {', '.join(ESTIMATORS.names())}."
        ),
    ] = "gradient",
    iterative: Annotated[
        bool, typer.Option("--iterative", help="Re-estimate importance after each step.")
    ] = False,
    step: Annotated[
        float, typer.Option(help="Share of the heads removed per iterative step.")
    ] = 0.1,
    scope: Annotated[
        str, typer.Option(help="global (rank all heads) or layer (same share per layer).")
    ] = "global",
    min_heads_per_layer: Annotated[
        int, typer.Option(help="Heads every layer keeps (0: a layer may go empty).")
    ] = 0,
    normalize: NormalizeOpt = False,
    unit: Annotated[
        str,
        typer.Option(
            help="head (query heads one by one), group (whole key/value groups, GQA) or layer "
            "(whole attention sub-layers by attention-layer importance, He et al. 2024)."
        ),
    ] = "head",
    tune: Annotated[
        bool,
        typer.Option(
            "--tune",
            help="With --method fisher: rescale the kept heads layer by layer by least squares, "
            "each layer on the pruned model's own inputs fitting the unpruned layer's output, "
            "folded into the weights (Kwon et al. 2022's mask tuning).",
        ),
    ] = False,
    uniform: Annotated[
        bool,
        typer.Option(
            "--uniform",
            help="The same number of heads from every key/value group of every layer (or of "
            "groups per layer with --unit group), so `probe export` can write the result.",
        ),
    ] = False,
    sweep: Annotated[
        bool, typer.Option("--sweep", help="Write the pruning curve instead of a checkpoint.")
    ] = False,
    methods: Annotated[
        str,
        typer.Option(
            help="Sweep: estimators, comma-separated; also fisher+tune (Fisher ranking with mask "
            "tuning at every point) and attention-layer (whole sub-layers)."
        ),
    ] = "gradient,ablation,random",
    seeds: Annotated[int, typer.Option(help="Sweep: importance splits / random seeds.")] = 3,
    fractions: Annotated[
        str | None,
        typer.Option(
            help="Sweep: fractions like '0,0.25,0.5' (default: every head count; imported "
            "models: 0, 0.1, ..., 0.9)."
        ),
    ] = None,
    lengths: LengthsOpt = None,
    text: TextOpt = None,
    whole: WholeOpt = False,
    max_tokens: MaxTokensOpt = 128,
    batch_size: BatchSizeOpt = 64,
    batches: BatchesOpt = 1,
    max_batch_tokens: MaxBatchTokensOpt = DEFAULT_BATCH_TOKENS,
    timing: Annotated[
        bool, typer.Option("--timing/--no-timing", help="Time original, masked and pruned.")
    ] = True,
    repeats: Annotated[
        int | None,
        typer.Option(
            help="Timed repeats per batch size, median (default: at most 10, imported models "
            "3, within the timing budget; given: exactly that many, no budget)."
        ),
    ] = None,
    timing_budget: Annotated[
        float | None,
        typer.Option(
            help="Seconds the side-by-side timing may take (default: "
            f"{run.TIMING_SHARE:.0%} of the time the pruning itself took); larger batch sizes "
            "that would not fit are left out."
        ),
    ] = None,
    timing_threads: Annotated[
        int, typer.Option(help="CPU threads while timing (1: stable on a shared CPU).")
    ] = 1,
    timing_sizes: Annotated[
        str | None,
        typer.Option(help="Batch sizes to time (default '1,16,64'; imported models: '1,8')."),
    ] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    """Remove heads for real (writes a smaller checkpoint), or with --sweep the pruning curve."""
    # the plain mistakes first (the checkpoint, --text and the counts were checked as parsed):
    # names, numbers and --out, answered before torch is imported
    run.check_options(method, scope, unit, uniform, tune=tune and not sweep)  # the sweep's below
    if sweep:
        run.sweep_methods(methods)
        _fractions(fractions)
        check_positive(seeds=seeds)
        if unit == Unit.LAYER or uniform or tune:
            raise ProbeError(
                "The sweep prunes by head or, with --unit group, by key/value group; for whole "
                "layers or tuned masks give --methods attention-layer or fisher+tune."
            )
    for spec in (lengths, timing_sizes if timing else None):
        if spec:
            parse_lengths(spec)
    check_positive(batch_size=batch_size, batches=batches, timing_threads=timing_threads,
                   max_batch_tokens=max_batch_tokens,
                   **({} if repeats is None else {"repeats": repeats}))  # fmt: skip
    if timing_budget is not None and not timing_budget > 0:
        raise ProbeError(
            f"--timing-budget must be a number of seconds above 0, got {timing_budget}."
        )
    # a curve may go in the checkpoint's folder
    writes = SWEEP_FILES if sweep else (*CHECKPOINT_FILES, *run.PRUNED_FILES)
    earlier = claim_output(out, writes, overwrite, inputs=inputs_of(checkpoint, text),
                           inside_ok=sweep)  # fmt: skip
    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    require_heads(ckpt)
    check_data_options(ckpt, text, lengths)
    data = run.Data(parse_lengths(lengths) if lengths else None, text, whole, max_tokens,
                    batch_size, batches)  # fmt: skip
    chosen = data.lengths_for(ckpt)
    options = {"iterative": iterative, "scope": scope, "min_heads_per_layer": min_heads_per_layer,
               "normalize": normalize, "unit": unit, "seed": seed,
               "max_batch_tokens": max_batch_tokens}  # fmt: skip
    if sweep:
        _sweep(ckpt, out, earlier, methods, seeds, fractions, data, options)
        return
    times = run.Timing(repeats, parse_lengths(timing_sizes) if timing_sizes else None,
                       timing_budget, threads=timing_threads)  # fmt: skip
    sizes = times.sizes_for(ckpt.imported) if timing else None
    longest = [max_tokens] if ckpt.imported else [max(chosen)]
    for size in sizes or []:  # batches timed, one at a time
        check_data_fits(ckpt, longest, size, 1, options="--timing-sizes")
    check_data(ckpt, data, 1, max_batch_tokens)
    with progress_bar() as bar:
        result = run.prune(ckpt, fraction, method=method, step=step, uniform=uniform, tune=tune,
                           data=data, timing=times if timing else None, progress=phased(bar),
                           **options)  # fmt: skip
    open_output(out, earlier)
    result.save(out)
    found = result.comparison
    report(found, fraction, ckpt.imported, sizes, times.budget_share)
    sites = [s.name for s in ckpt.model_cfg.sites()]
    for site, heads in zip(sites, [s.kept_heads for s in found.model.cfg.sites()], strict=True):
        console.print(f"  {site}: keeps heads {list(heads) if heads else 'none'}")
    console.print(f"wrote the pruned checkpoint {shown(out)}")


def register(app: typer.Typer) -> None:
    app.command(
        "prune",
        no_args_is_help=True,
        epilog="Example: probe prune runs/copy --fraction 0.5 --out runs/copy-pruned; "
        "probe prune runs/copy --sweep --out runs/copy/sweep",
    )(prune_cli)
