"""`probe scaling`: why attention scores are divided by sqrt(d_k), with numbers: score variance,
entropy and saturation at initialization, then models trained identical but for the scale."""

from __future__ import annotations

from typing import Annotated

import typer
from probe_cli.common import (
    DeviceOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    check_positive,
    console,
    fmt_stat,
    int_list,
    shown,
    stats_progress,
)
from probe_cli.train import parse_range
from rich.table import Table

from probe import provenance
from probe.errors import ProbeError
from probe.files import claim_output, open_output
from probe.words import counted


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
    widths, lengths = int_list(d_ks, "--d-ks"), int_list(ns, "--ns")
    lo, hi = parse_range(train_len, "--train-len") if steps else (0, 0)
    earlier = claim_output(out, ("scaling.csv", "scaling_training.csv", "manifest.json"), overwrite)
    from probe.analysis.scaling import SCALES, init_scaling, train_scaling
    from probe.report.attention_plots import write_scaling
    from probe.training.train import resolve_device

    used = resolve_device(device)  # checked even when nothing is trained
    init = init_scaling(widths, lengths, SCALES, n_queries=queries, seed=seed)
    curves = None
    if steps:
        with stats_progress() as bar:
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
            fmt_stat(value("loss"), 3),
            fmt_stat(value("exact_match")),
            fmt_stat(value("normalized_entropy")),
            fmt_stat(value("max_logit", "max"), 1),
        )
    console.print(view)


def register(app: typer.Typer) -> None:
    app.command(
        "scaling",
        no_args_is_help=True,
        epilog="Example: probe scaling --steps 0 --out runs/scaling",
    )(scaling_cli)
