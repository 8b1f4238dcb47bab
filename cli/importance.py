"""`probe importance`: how much each attention head (or key/value group) matters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from probe_cli.common import (
    BatchSizeOpt,
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    MaxBatchTokensOpt,
    MaxTokensOpt,
    NprocOpt,
    OutOpt,
    OversubscribeOpt,
    OverwriteOpt,
    PickleOpt,
    SeedOpt,
    TextOpt,
    WholeOpt,
    check_data_options,
    check_positive,
    console,
    inputs_of,
    launching,
    load_model,
    relaunch,
    require_heads,
    shown,
    write_manifest,
)
from probe_cli.selection import (
    BatchesOpt,
    LengthsOpt,
    NormalizeOpt,
    lengths_for,
    phased,
    progress_bar,
    splits,
    text_settings,
)
from rich.table import Table

from probe.data.task_spec import parse_lengths
from probe.errors import ProbeError
from probe.fields import choice
from probe.files import claim_output
from probe.measure.batching import DEFAULT_BATCH_TOKENS
from probe.pruning.choices import ESTIMATORS, Unit, described, parse_methods

if TYPE_CHECKING:
    import pandas as pd


def _importance_view(table: pd.DataFrame, method: str, sites: list[str], n_head: int) -> Table:
    wide = n_head > 6
    view = Table(title=f"{method} importance (blank: pruned)", padding=(0, 1 if wide else 2))
    view.add_column("layer" if wide else "site")
    for h in range(n_head):
        view.add_column(f"{h}" if wide else f"head {h}", justify="right")
    part = table[table["method"] == method].set_index(["layer", "head"])["value"]
    digits = 2 if wide else 4
    for layer, site in enumerate(sites):
        cells = [
            f"{part[(layer, h)]:.{digits}g}" if (layer, h) in part.index else ""
            for h in range(n_head)
        ]
        view.add_row(str(layer) if wide else site, *cells)
    return view


def _layer_view(layers: pd.DataFrame) -> Table:
    view = Table(title="attention-layer importance: 1 - cos(x, x + attn(norm x)), low = droppable")
    view.add_column("layer", justify="right")
    view.add_column("site")
    view.add_column("importance", justify="right")
    for r in layers.itertuples():
        view.add_row(str(r.layer), r.site, f"{r.value:.4g}")
    return view


def _group_view(groups: pd.DataFrame) -> Table:
    view = Table(title="importance per key/value group (sum over its query heads; larger = "
                 "more important)")  # fmt: skip
    view.add_column("method")
    view.add_column("layer", justify="right")
    n = int(groups["group"].max()) + 1
    for g in range(n):
        view.add_column(f"group {g}", justify="right")
    for (method, layer), part in groups.groupby(["method", "layer"], sort=False):
        values = dict(zip(part["group"], part["score"], strict=True))
        view.add_row(method, str(layer),
                     *(f"{values[g]:.3g}" if g in values else "" for g in range(n)))  # fmt: skip
    return view


def importance_cli(
    checkpoint: CheckpointArg,
    out: OutOpt,
    method: Annotated[
        str, typer.Option(help=f"{described()}; several with commas, or 'all'.")
    ] = "gradient",
    lengths: LengthsOpt = None,
    text: TextOpt = None,
    whole: WholeOpt = False,
    max_tokens: MaxTokensOpt = 128,
    batch_size: BatchSizeOpt = 64,
    batches: BatchesOpt = 1,
    max_batch_tokens: MaxBatchTokensOpt = DEFAULT_BATCH_TOKENS,
    normalize: NormalizeOpt = False,
    unit: Annotated[
        str,
        typer.Option(
            help="head; group: also score each key/value group (sum of its heads); layer: also "
            "score each attention sub-layer (1 - cos(x, x + attn), He et al. 2024)."
        ),
    ] = "head",
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
    nproc: NprocOpt = 1,
    oversubscribe: OversubscribeOpt = False,
) -> None:
    """Score every attention head; writes importance.csv, importance.png (+ correlations, and
    importance_groups.csv with --unit group). With --nproc N, gradient and Fisher importance
    run data-parallel: each process scores every N-th batch and the per-head sums are added."""
    unit = choice(Unit, unit, "pruning unit")
    methods = parse_methods(method)
    if lengths:
        parse_lengths(lengths)
    check_positive(batch_size=batch_size, batches=batches, nproc=nproc,
                   max_batch_tokens=max_batch_tokens)  # fmt: skip
    parallel = [e.name for e in ESTIMATORS if e.data_parallel]
    if nproc > 1 and (set(methods) - set(parallel) or unit != Unit.HEAD):
        raise ProbeError(f"--nproc runs {' and '.join(parallel)} importance by head only; drop "
                         "the other methods or --unit, or run them in one process.")  # fmt: skip
    writes = ("importance.csv", "importance.png", "correlations.csv", "correlations.png",
              "importance_groups.csv", "importance_layers.csv", "manifest.json")  # fmt: skip
    # --out is checked before torch is imported (by every rank; rank 0 alone writes)
    earlier = claim_output(out, writes, overwrite, inputs=inputs_of(checkpoint, text),
                           inside_ok=True)  # fmt: skip
    import pandas as pd

    from probe.files import open_output
    from probe.pruning.groups import group_table
    from probe.pruning.importance import compare_estimators
    from probe.pruning.layer_drop import layer_importance
    from probe.report.files import atomic_save_figure, atomic_write_csv
    from probe.report.pruning_plots import correlation_heatmap, importance_heatmap
    from probe.training.distributed import process_group, world_from_env
    from probe.training.train import resolve_device

    # with --nproc N, everything is checked here before the N processes start
    launcher = launching(nproc, device, oversubscribe)
    world = world_from_env()
    if not world.main:
        console.quiet = True  # rank 0 alone writes and reports
        earlier = []
    ckpt = load_model(checkpoint, "cpu" if launcher else device, dtype, allow_pickle)
    require_heads(ckpt)
    check_data_options(ckpt, text, lengths)
    chosen = lengths_for(ckpt, lengths)
    data = (text, whole, max_tokens)
    (split,), _ = splits(ckpt, chosen, batch_size, batches, seed, text=data,
                         max_batch_tokens=max_batch_tokens)  # fmt: skip
    if launcher:
        del ckpt, split  # each rank loads its own
        relaunch(nproc)
        return
    with progress_bar() as bar, process_group(world, resolve_device(device)):
        table, corr = compare_estimators(
            ckpt.model, split, methods, normalize=normalize, seed=seed, progress=phased(bar),
            max_batch_tokens=max_batch_tokens,
        )  # fmt: skip
    if not world.main:
        return
    open_output(out, earlier)
    sites, n_head = [s.name for s in ckpt.model_cfg.sites()], ckpt.model_cfg.n_head
    atomic_write_csv(out / "importance.csv", table)
    atomic_save_figure(out / "importance.png", importance_heatmap(table, sites, n_head))
    if len(methods) > 1:
        atomic_write_csv(out / "correlations.csv", corr)
        atomic_save_figure(out / "correlations.png", correlation_heatmap(corr))
    if unit == Unit.LAYER:
        layers = layer_importance(ckpt.model, split, max_batch_tokens)
        atomic_write_csv(out / "importance_layers.csv", layers)
        console.print(_layer_view(layers))
    if unit == Unit.GROUP:
        groups = pd.concat(
            [group_table(table[table["method"] == m], ckpt.model).assign(method=m)
             for m in methods]
        )  # fmt: skip
        atomic_write_csv(out / "importance_groups.csv", groups)
        console.print(_group_view(groups))
    write_manifest(
        out, ckpt, command="importance", methods=methods, lengths=chosen,
        batch_size=batch_size, batches=batches, normalize=normalize, seed=seed,
        max_batch_tokens=max_batch_tokens, **text_settings(ckpt, data),
    )  # fmt: skip
    for m in methods:
        console.print(_importance_view(table, m, sites, n_head))
    if len(methods) > 1:
        wide = corr.pivot(index="method", columns="other", values="rho").loc[methods, methods]
        low = ", ".join(e.name for e in ESTIMATORS if e.low_is_important)
        view = Table(title=f"Spearman rho between estimators ({low} negated)")
        view.add_column("")
        for m in methods:
            view.add_column(m, justify="right")
        for m, row in wide.iterrows():
            view.add_row(m, *(f"{v:.2f}" for v in row))
        console.print(view)
    console.print(f"wrote {shown(out / 'importance.csv')} and {shown(out / 'importance.png')}")


def register(app: typer.Typer) -> None:
    app.command(
        "importance",
        no_args_is_help=True,
        epilog="Example: probe importance runs/copy --method gradient,ablation --out "
        "runs/copy/importance",
    )(importance_cli)
