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
    model_device,
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
    data_name,
    lengths_for,
    phased,
    progress_bar,
    splits,
    text_settings,
)
from rich.table import Table

from probe.checkpoint_files import CHECKPOINT_FILES
from probe.data.task_spec import parse_lengths
from probe.errors import ProbeError
from probe.fields import choice
from probe.files import claim_output
from probe.measure.batching import DEFAULT_BATCH_TOKENS
from probe.provenance import device_name
from probe.pruning.choices import CURVE_EXTRAS, Method, Scope, Unit, parse_methods
from probe.words import counted

SWEEP_FILES = ("pruning.csv", "pruning.png", "pruning_loss.png", "manifest.json")
PRUNED_FILES = ("removed_heads.csv", "prune_metrics.csv", "prune_timing.csv")  # + the checkpoint
TIMING_SHARE = 0.25  # the side-by-side timing's default budget: this share of the time the
# pruning itself (importance, pruning, scoring) took, so a large model is not mostly stopwatch


# ------------------------------------------------------------------------------ importance
# ---------------------------------------------------------------------------------- prune
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


def _sweep_methods(methods: str) -> list[str]:
    """The sweep's --methods: estimators, and the curve's own methods (CURVE_EXTRAS)."""
    wanted = [m.strip() for m in methods.split(",") if m.strip()]
    extras = [m for m in wanted if m in CURVE_EXTRAS]
    rest = [m for m in wanted if m not in CURVE_EXTRAS]
    return (parse_methods(",".join(rest)) if rest else []) + extras


def _sweep(ckpt, out, methods, seeds, fractions, lengths, batch_size, batches, seed, select,
           earlier, data, max_batch_tokens):  # fmt: skip
    from probe.files import open_output
    from probe.pruning.curves import primary_metric, pruning_curve
    from probe.report.files import atomic_save_figure, atomic_write_csv
    from probe.report.pruning_plots import pruning_curve_plot

    names = _sweep_methods(methods)
    if "random" not in names:
        names.append("random")
        console.print("adding the random baseline to the sweep")
    if seeds < 1:
        raise ProbeError(f"--seeds must be at least 1, got {seeds}.")
    sets, scoring = splits(ckpt, lengths, batch_size, batches, seed, n=seeds, text=data,
                           max_batch_tokens=max_batch_tokens)  # fmt: skip
    metric = primary_metric(scoring)
    chosen_fractions = _fractions(fractions)
    if chosen_fractions is None and ckpt.imported:  # every head count would be hundreds of points
        chosen_fractions = [i / 10 for i in range(10)]
    with progress_bar() as bar:
        job = bar.add_task("sweep", total=None)
        curve = pruning_curve(
            ckpt.model, sets, scoring, names, chosen_fractions,
            progress=lambda d, t: bar.update(job, completed=d, total=t),
            max_batch_tokens=max_batch_tokens, **select,
        )  # fmt: skip
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
    return names


def prune_cli(
    checkpoint: CheckpointArg,
    out: OutOpt,
    fraction: Annotated[
        float, typer.Option(help="Share of the heads to remove, 0-1.", callback=share_given)
    ] = 0.5,
    method: Annotated[
        str, typer.Option(help="Importance estimator that ranks the heads.")
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
            f"{TIMING_SHARE:.0%} of the time the pruning itself took); larger batch sizes "
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
    if choice(Unit, unit, "pruning unit") != Unit.LAYER:  # whole layers rank by their own score
        choice(Method, method, "importance method")
    choice(Scope, scope, "pruning scope")
    if sweep:
        _sweep_methods(methods)
        _fractions(fractions)
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
    writes = SWEEP_FILES if sweep else (*CHECKPOINT_FILES, *PRUNED_FILES)
    earlier = claim_output(out, writes, overwrite, inputs=inputs_of(checkpoint, text),
                           inside_ok=sweep)  # fmt: skip
    from probe.checkpoint import save_checkpoint
    from probe.checkpoint_files import TOKENIZER
    from probe.files import open_output
    from probe.pruning.compare import prune_and_compare
    from probe.report.files import atomic_write_csv
    from probe.runtime import Runtime

    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    require_heads(ckpt)
    check_data_options(ckpt, text, lengths)
    chosen = lengths_for(ckpt, lengths)
    data = (text, whole, max_tokens)
    select = {"iterative": iterative, "scope": scope, "min_heads_per_layer": min_heads_per_layer,
              "normalize": normalize}  # fmt: skip
    settings = {"lengths": chosen, "batch_size": batch_size, "batches": batches, "seed": seed,
                "unit": unit, **select, **text_settings(ckpt, data)}  # fmt: skip
    if sweep:
        if unit == "layer" or uniform or tune:
            raise ProbeError(
                "The sweep prunes by head or, with --unit group, by key/value group; for whole "
                "layers or tuned masks give --methods attention-layer or fisher+tune."
            )
        if unit == "group":
            select = {**select, "unit": "group"}
        names = _sweep(
            ckpt,
            out,
            methods,
            seeds,
            fractions,
            chosen,
            batch_size,
            batches,
            seed,
            select,
            earlier,
            data,
            max_batch_tokens,
        )
        write_manifest(out, ckpt, command="prune --sweep", methods=names, seeds=seeds,
                       max_batch_tokens=max_batch_tokens, **settings)  # fmt: skip
        return
    real = ckpt.imported  # a real model's forward pass is slow: time fewer, smaller batches
    # the timing gets a budget unless --repeats asks for an exact count: --timing-budget, else
    # a share of what the pruning itself took
    share = TIMING_SHARE if timing_budget is None and repeats is None else None
    repeats = repeats if repeats is not None else (3 if real else 10)
    timing_sizes = timing_sizes or ("1,8" if real else "1,16,64")
    longest = [max_tokens] if real else [max(chosen)]
    for size in parse_lengths(timing_sizes) if timing else []:  # batches timed, one at a time
        check_data_fits(ckpt, longest, size, 1, options="--timing-sizes")
    (split,), scoring = splits(ckpt, chosen, batch_size, batches, seed, text=data,
                               max_batch_tokens=max_batch_tokens)  # fmt: skip
    if unit != "head" or uniform:
        select = {**select, "unit": unit, "uniform": uniform}
    if tune:
        if unit != "head" or uniform:
            raise ProbeError("--tune works with --unit head without --uniform.")
        select = {**select, "tune": True}
    with progress_bar() as bar:
        result = prune_and_compare(
            ckpt.model, split, scoring, fraction, timing=timing, repeats=repeats,
            batch_sizes=parse_lengths(timing_sizes), threads=timing_threads,
            timing_budget=timing_budget, timing_share=share, max_batch_tokens=max_batch_tokens,
            # a real model is pruned in place (memory: its weights once), a trained one beside
            # a copy unless that would not fit (its timing interleaves the two)
            in_place=False if tune else (True if ckpt.imported else None),
            progress=phased(bar), method=method, step=step,
            seed=seed, **select,
        )  # fmt: skip
    record = {
        "source": str(ckpt.path), "method": method, "fraction": fraction, "step": step,
        **select, "removed": result.removed[["layer", "head"]].values.tolist(),
        "kept": [list(s.kept_heads) for s in result.model.cfg.sites()],
        "metrics": result.metrics.to_dict("records"), "max_batch_tokens": max_batch_tokens,
        "timing_budget": result.timing_budget, "in_place": result.in_place,
        "device": device_name(model_device(ckpt)),
        "runtime": Runtime.cpu().record(ckpt.model),
    }  # fmt: skip
    meta = {**ckpt.meta, "pruning": [*ckpt.meta.get("pruning", []), record]}
    open_output(out, earlier)
    tokenizer = ckpt.tokenizer() if ckpt.imported and (ckpt.path / TOKENIZER).is_file() else None
    save_checkpoint(out, result.model, ckpt.task, ckpt.train_cfg, meta=meta, source=ckpt.source,
                    tokenizer=tokenizer)  # fmt: skip
    atomic_write_csv(out / "removed_heads.csv", result.removed)
    atomic_write_csv(out / "prune_metrics.csv", result.metrics)
    if not result.timing.empty:
        atomic_write_csv(out / "prune_timing.csv", result.timing)
    report(result, fraction, ckpt.imported, parse_lengths(timing_sizes) if timing else None,
           share)  # fmt: skip
    sites = [s.name for s in ckpt.model_cfg.sites()]
    for site, heads in zip(sites, [s.kept_heads for s in result.model.cfg.sites()], strict=True):
        console.print(f"  {site}: keeps heads {list(heads) if heads else 'none'}")
    console.print(f"wrote the pruned checkpoint {shown(out)}")


def register(app: typer.Typer) -> None:
    app.command(
        "prune",
        no_args_is_help=True,
        epilog="Example: probe prune runs/copy --fraction 0.5 --out runs/copy-pruned; "
        "probe prune runs/copy --sweep --out runs/copy/sweep",
    )(prune_cli)
