"""`probe train` and `probe info`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from probe_cli.common import (
    CheckpointArg,
    DeviceOpt,
    OutOpt,
    OversubscribeOpt,
    PickleOpt,
    SeedOpt,
    console,
    launching,
    relaunch,
    shown,
)
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from probe.checkpoint_files import CHECKPOINT_FILES
from probe.config import ModelConfig
from probe.data.task_spec import TaskConfig, parse_lengths
from probe.errors import ProbeError
from probe.files import claim_output
from probe.train_config import Schedule, TrainConfig
from probe.training.presets import with_preset
from probe.words import counted


def parse_range(spec: str, what: str) -> tuple[int, int]:
    lengths = parse_lengths(spec)
    if lengths != list(range(lengths[0], lengths[-1] + 1)):
        raise ProbeError(f"{what} must be a contiguous range 'lo:hi', got '{spec}'.")
    return lengths[0], lengths[-1]


# CLI option -> (config section, field) for the options a preset may set
PRESET_OPTIONS = {
    "pe": ("model", "pe"), "ffn": ("model", "ffn"), "ffn_mult": ("model", "ffn_mult"),
    "norm": ("model", "norm"), "scale": ("model", "scale"), "dropout": ("model", "dropout"),
    "lr": ("train", "lr"), "warmup": ("train", "warmup"),
    "label_smoothing": ("train", "label_smoothing"),
}  # fmt: skip


def _given(ctx: typer.Context, name: str) -> bool:
    """True when option `name` was typed on the command line (not left at its default)."""
    source = ctx.get_parameter_source(name)  # an enum of (Typer's) click: compare by name
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def train_cli(
    ctx: typer.Context,
    out: OutOpt,
    preset: Annotated[
        str | None,
        typer.Option(help="paper: the 2017 model and optimizer (options given here still win)."),
    ] = None,
    task: Annotated[
        str, typer.Option(help="copy, reverse, sort, addition, parity, recall, repeat-copy.")
    ] = "copy",
    arch: Annotated[str, typer.Option(help="decoder, encoder or encoder-decoder.")] = "decoder",
    pe: Annotated[
        str, typer.Option(help="sinusoidal, learned, none, rope, alibi, t5, fire.")
    ] = "learned",
    train_len: Annotated[str, typer.Option(help="Task lengths to train on, 'lo:hi'.")] = "2:8",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 1500,
    seed: SeedOpt = 0,
    layers: Annotated[int, typer.Option(help="Blocks (encoder blocks for encoder-decoder).")] = 2,
    heads: Annotated[int, typer.Option(help="Heads per attention sub-layer.")] = 4,
    d_model: Annotated[int, typer.Option(help="Residual stream width.")] = 64,
    d_head: Annotated[
        int | None, typer.Option(help="Per-head width (default d_model/heads).")
    ] = None,
    ffn: Annotated[
        str, typer.Option(help="relu, gelu, gelu-tanh or none (attention-only).")
    ] = "relu",
    ffn_mult: Annotated[float, typer.Option(help="FFN width / d_model.")] = 4.0,
    norm: Annotated[str, typer.Option(help="pre or post (the paper) LayerNorm.")] = "pre",
    scale: Annotated[
        str, typer.Option(help="sqrt (1/sqrt(d_k)), inverse (1/d_k), none, learned.")
    ] = "sqrt",
    qk_norm: Annotated[bool, typer.Option("--qk-norm", help="LayerNorm on q and k.")] = False,
    log_scale: Annotated[
        bool, typer.Option("--log-scale", help="Scale logits by log(n)/log(L_train).")
    ] = False,
    random_positions: Annotated[
        bool, typer.Option("--random-positions", help="Randomized positions (Ruoss et al. 2023).")
    ] = False,
    max_len: Annotated[
        int, typer.Option(help="Positions of a learned table / random range.")
    ] = 256,
    dropout: Annotated[float, typer.Option(help="Dropout on sub-layers and weights.")] = 0.0,
    label_smoothing: Annotated[
        float, typer.Option(help="Label smoothing of the training loss (the paper: 0.1).")
    ] = 0.0,
    batch_size: Annotated[int, typer.Option(help="Examples per step.")] = 64,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 2e-3,
    warmup: Annotated[int, typer.Option(help="Warm-up steps.")] = 40,
    n_symbols: Annotated[int, typer.Option(help="Task alphabet size.")] = 16,
    eval_every: Annotated[int, typer.Option(help="Evaluate and checkpoint every N steps.")] = 100,
    stats_every: Annotated[
        int, typer.Option(help="Log per-head attention stats every N steps (0: off).")
    ] = 0,
    device: DeviceOpt = "auto",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a checkpoint already in --out.")
    ] = False,
    nproc: Annotated[
        int,
        typer.Option(
            "--nproc",
            help="Processes to train in (DistributedDataParallel: NCCL on GPUs, gloo on the "
            "CPU; at most one per core, or per GPU); each takes batch_size / N examples of "
            "every step.",
        ),
    ] = 1,
    oversubscribe: OversubscribeOpt = False,
) -> None:
    """Train a model on a synthetic task and write a checkpoint directory."""
    # the settings and --out are checked before torch is imported
    task_cfg = TaskConfig(name=task, n_symbols=n_symbols)
    lo, hi = parse_range(train_len, "--train-len")
    values = {
        "pe": pe, "ffn": ffn, "ffn_mult": ffn_mult, "norm": norm, "scale": scale,
        "dropout": dropout, "lr": lr, "warmup": warmup, "label_smoothing": label_smoothing,
    }  # fmt: skip
    chosen: dict[str, dict] = {"model": {}, "train": {}}
    for option, (section, name) in PRESET_OPTIONS.items():
        if preset is None or _given(ctx, option):
            chosen[section][name] = values[option]
    settings = with_preset(preset, chosen)
    model_cfg = ModelConfig(
        arch=arch, vocab_size=task_cfg.vocab_size, n_layer=layers, n_head=heads, d_model=d_model,
        d_head=d_head, max_len=max_len, qk_norm=qk_norm, log_scale_len=hi if log_scale else None,
        **settings["model"],
    )  # fmt: skip
    train_cfg = TrainConfig(
        steps=steps, batch_size=batch_size, train_len=(lo, hi),
        random_positions=random_positions, seed=seed, eval_every=eval_every,
        stats_every=stats_every, device=device, **settings["train"],
    )  # fmt: skip
    if train_cfg.schedule == Schedule.COSINE and train_cfg.warmup > steps:
        train_cfg = dataclasses.replace(train_cfg, warmup=steps)
    pe = model_cfg.pe
    claim_output(out, CHECKPOINT_FILES, overwrite)  # before any work: a bad --out fails now
    from probe.training.distributed import world_from_env
    from probe.training.train import TrainProgress, check_training, resolve_device, train

    # with --nproc N, everything is checked here before the N processes start
    launcher = launching(nproc, device, oversubscribe)
    world = world_from_env()
    if not world.main:
        console.quiet = True  # rank 0 alone reports
    resolve_device(device)
    if launcher:
        check_training(model_cfg, task_cfg, train_cfg, shards=nproc)
        relaunch(nproc)
        return
    console.print(
        f"training a {arch} ({pe}, {counted(layers, 'layer')} x {counted(heads, 'head')}, "
        f"d_model {d_model}) on [bold]{task}[/] lengths {lo}-{hi} for "
        f"{counted(steps, 'step')} -> {shown(out)}"
    )
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console, transient=False) as bar:
        job = bar.add_task("train", total=steps, stats="")

        def show(p: TrainProgress) -> None:
            stats = f"loss {p.loss:.3f}  acc {p.accuracy:.2f}  lr {p.lr:.1e}"
            if p.eval_exact is not None:
                stats += f"  eval exact {p.eval_exact:.3f}"
            bar.update(job, completed=p.step, stats=stats)

        result = train(model_cfg, task_cfg, train_cfg, out, progress=show, overwrite=overwrite)
    if not world.main:
        return  # rank 0 evaluated, saved and reports
    final = result.metrics.query("split == 'eval' and metric == 'exact_match'")
    last = final[final.step == final.step.max()]
    exact = (last.value * last.n).sum() / last.n.sum()
    console.print(
        f"exact match at the training lengths: [bold]{exact:.3f}[/]; checkpoint: {shown(out)}"
    )


def _sites_table(cfg: ModelConfig) -> Table:
    """Heads (and key/value groups) each attention site keeps, in original ids."""
    grouped = cfg.kv_heads != cfg.n_head
    view = Table(title="attention sites (original head ids)")
    for col in ("site", "heads kept", *(("key/value groups kept",) if grouped else ())):
        view.add_column(col)
    for site in cfg.sites():
        kept = f"{len(site.kept_heads)}/{site.n_head}: {_ids(site.kept_heads)}"
        groups = f"{len(site.kept_groups)}/{site.n_kv_head}: {_ids(site.kept_groups)}"
        view.add_row(site.name, kept, *((groups,) if grouped else ()))
    return view


def _ids(ids: tuple[int, ...]) -> str:
    """0,1,2,5 -> '0-2, 5'."""
    if not ids:
        return "none"
    runs, start = [], ids[0]
    for prev, cur in zip(ids, (*ids[1:], None), strict=True):
        if cur != prev + 1 if cur is not None else True:
            runs.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = cur
    return ", ".join(runs)


def info_cli(checkpoint: CheckpointArg, allow_pickle: PickleOpt = False) -> None:
    """Show a checkpoint's configuration and parameter counts (its files are checked; no
    weight is read, so an 8B model's info takes no memory)."""
    from probe.checkpoint import load_checkpoint
    from probe.runtime import dtype_name
    from probe.weights import weights_dtype

    ckpt = load_checkpoint(checkpoint, allow_pickle=allow_pickle, read_weights=False)
    view = Table(title=f"{Path(checkpoint)}")
    view.add_column("section")
    view.add_column("setting")
    view.add_column("value")
    sections = [("model", ckpt.model_cfg.to_dict())]
    if ckpt.source is not None:
        sections.append(("source", ckpt.source))
    if ckpt.task is not None and ckpt.train_cfg is not None:
        sections += [("task", ckpt.task.to_dict()), ("train", ckpt.train_cfg.to_dict())]
    for section, values in sections:
        for key, value in values.items():
            if key == "kept_heads" and value is not None:
                value = "see the attention sites below"
            view.add_row(section, key, str(value))
    view.add_row("weights", "dtype", dtype_name(weights_dtype(ckpt.model)))
    for key in ("git_commit", "created", "steps_done", "train_seconds"):
        if key in ckpt.meta:
            view.add_row("meta", key, str(ckpt.meta[key]))
    console.print(view)
    console.print(_sites_table(ckpt.model_cfg))
    counts = Table(title="parameters")
    counts.add_column("component")
    counts.add_column("parameters", justify="right")
    for key, value in ckpt.model.parameter_counts().items():
        counts.add_row(key, f"{value:,}")
    console.print(counts)


def register(app: typer.Typer) -> None:
    from probe_cli.evaluate import eval_cli  # registered here: the help lists train, eval, info

    app.command("train", epilog="Example: probe train --task copy --out runs/copy")(train_cli)
    app.command("eval", epilog="Example: probe eval runs/copy --lengths 1:16 --out runs/copy/eval")(
        eval_cli
    )
    app.command("info", epilog="Example: probe info runs/copy")(info_cli)
