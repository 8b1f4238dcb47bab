"""`probe kv-plan`: choose which key/value heads keep the full cache (the others keep sink tokens
and a recent window), from head roles or a baseline."""

from __future__ import annotations

from typing import Annotated

import typer
from probe_cli.common import (
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    OutOpt,
    OverwriteOpt,
    PickleOpt,
    SeedOpt,
    TextOpt,
    WholeOpt,
    check_positive,
    check_seed,
    console,
    inputs_of,
    load_model,
    note_text,
    shown,
    write_manifest,
)

from probe.errors import ProbeError

WRITES = ("plan.json", "scores.csv", "heads.csv", "manifest.json")


def _declared(method: str, name: str) -> tuple[object, str]:
    """An option's default and its flag's help ("razor: repeated sequences."), from the method's
    declaration (`probe.kv.methods`)."""
    import dataclasses

    from probe.kv.methods import METHODS

    field = {f.name: f for f in dataclasses.fields(METHODS.get(method).options)}[name]
    return field.default, f"{method}: {field.metadata['help']}."


def _method_help() -> str:
    from probe.kv.methods import method_help

    return method_help()


def _set_help() -> str:
    from probe.kv.methods import options_help

    return (f"A method's option as key=value (repeatable; over its own flag): {options_help()}. "
            "Values are read as in a study file.")  # fmt: skip


NEEDLES, CONTEXT = _declared("retrieval", "needles"), _declared("retrieval", "context")
PERIOD, ROWS = _declared("razor", "period"), _declared("razor", "rows")
STEPS, LR, L1 = _declared("duo", "steps"), _declared("duo", "lr"), _declared("duo", "l1")


def kv_plan_cli(
    ctx: typer.Context,
    checkpoint: CheckpointArg,
    out: OutOpt,
    method: Annotated[str, typer.Option(help=_method_help())],
    full_heads: Annotated[
        float | None,
        typer.Option(
            "--full-heads",
            help="Share (0-1) of the key/value heads, over the whole model, that keep the full "
            "cache: round(share x total), at least one when above 0. Default: razor's own rule "
            "(the top 14% of heads by induction score and 1% by echo score), 0.25 for the "
            "other methods.",
            show_default=False,
        ),
    ] = None,
    sink: Annotated[int, typer.Option(help="First tokens every streaming head keeps.")] = 4,
    window: Annotated[
        int, typer.Option(help="Most recent tokens every streaming head keeps.")
    ] = 256,
    text: TextOpt = None,
    whole: WholeOpt = False,
    needles: Annotated[int, typer.Option(help=NEEDLES[1])] = NEEDLES[0],
    context: Annotated[int, typer.Option(help=CONTEXT[1])] = CONTEXT[0],
    period: Annotated[int, typer.Option(help=PERIOD[1])] = PERIOD[0],
    rows: Annotated[int, typer.Option(help=ROWS[1])] = ROWS[0],
    steps: Annotated[int, typer.Option(help=STEPS[1])] = STEPS[0],
    lr: Annotated[float, typer.Option(help=LR[1])] = LR[0],
    l1: Annotated[float, typer.Option(help=L1[1])] = L1[0],
    sets: Annotated[
        list[str] | None, typer.Option("--set", metavar="<k=v>", help=_set_help())
    ] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    """Write a key/value-cache plan: OUT/plan.json (per layer, the key/value heads keeping the
    full cache; sink and window of the others), OUT/scores.csv (the key/value-head score it
    ranked by: the max over the group's query heads), OUT/heads.csv (per query head) and
    OUT/manifest.json."""
    import dataclasses
    import time

    from click.core import ParameterSource

    from probe.files import claim_output
    from probe.kv.methods import METHODS
    from probe.kv.plan import KVPlan
    from probe.options import parse_sets

    how = METHODS.find(method)
    if how is None:
        raise ProbeError(METHODS.unknown(method, "--method"))
    if full_heads is None and how.choose is None:  # a method of no share of its own
        full_heads = 0.25
    if full_heads is not None and not 0.0 <= full_heads <= 1.0:
        raise ProbeError(f"--full-heads must be a share in [0, 1], got {full_heads}.")
    if sink < 0:
        raise ProbeError(f"--sink must be at least 0, got {sink}.")
    check_positive(window=window)
    flags = {"needles": needles, "context": context, "period": period, "rows": rows,
             "steps": steps, "lr": lr, "l1": l1}  # fmt: skip
    changed = {k: v for k, v in flags.items()
               if ctx.get_parameter_source(k) != ParameterSource.DEFAULT}  # fmt: skip
    for owner in METHODS:  # a flag of another method is still checked by that method's bounds
        theirs = {k: v for k, v in changed.items() if k in owner.fields()}
        if theirs and owner is not how:
            owner.read(theirs, flags=True)
    given = {k: v for k, v in changed.items() if k in how.fields()}
    chosen = parse_sets(how.options, sets or (), how.name)
    how.read(chosen, "--set")  # named as given: --set echo_ratio=...
    options = how.read({**given, **chosen}, flags=True)
    # sink, window and the method's plan fields within a plan's ranges
    KVPlan(method, full_heads or 0.0, sink, window, (), **how.extra_fields(options))
    check_seed(seed)
    earlier = claim_output(out, WRITES, overwrite, inputs=inputs_of(checkpoint, text))
    from probe.files import open_output
    from probe.kv.planning import check_plannable, make_plan

    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    check_plannable(ckpt.model_cfg)
    if how.prompts is not None and ckpt.objective != "causal-lm":  # it reads text
        textless = next(m.name for m in METHODS if m.scores and m.prompts is None)
        raise ProbeError(
            f"{ckpt.path}: --method {method} needs an imported causal language model with a "
            f"tokenizer (probe import); use --method {textless}."
        )
    how.check_fits(ckpt.model_cfg, options, lambda name: f"--{name.replace('_', '-')}"
                   if name in flags else f"--set {name}")  # fmt: skip
    prompts = None
    if how.prompts is not None:
        from probe.data.text import read_documents

        note_text(text)
        prompts = how.prompts(read_documents(text, whole=whole), ckpt.tokenizer(), options, seed)
    start = time.perf_counter()
    with console.status(f"kv-plan {method}") as status:
        result = make_plan(ckpt.model, method, full_heads, sink, window, options=options,
                           seed=seed, prompts=prompts,
                           progress=lambda s: status.update(s))  # fmt: skip
    seconds = time.perf_counter() - start
    out = open_output(out, earlier)
    result.plan.write(out / "plan.json")
    from probe.report.files import atomic_write_csv  # a crash or a full disk leaves no half file

    atomic_write_csv(out / "scores.csv", result.scores)
    atomic_write_csv(out / "heads.csv", result.heads)
    write_manifest(out, ckpt, command="kv-plan", method=method,
                   full_share=result.plan.full_share, full_heads_asked=full_heads,
                   sink=sink, window=window, seed=seed, aggregate="max over query heads",
                   seconds=round(seconds, 2), **result.notes, **dataclasses.asdict(options),
                   **({"text": str(text) if text else "shipped corpus", "whole": whole}
                      if how.prompts is not None else {}))  # fmt: skip
    _show(result.plan, ckpt.model_cfg, seconds, out, how.shown)


def _show(plan, cfg, seconds: float, out, shown_as: str) -> None:
    sites = cfg.sites()
    total = sum(len(s.kept_groups) for s in sites)
    kept = sum(len(f) for f in plan.full)
    recent = f"{plan.window} recent tokens"
    if plan.buffer_ratio:
        recent = f"max({plan.window}, n/{plan.buffer_ratio:g}) of the n recent tokens"
    token = " + a compensation token for what they drop" if plan.compensate else ""
    console.print(
        f"{shown_as}: {kept} of {total} key/value heads keep the full cache; the others keep "
        f"{plan.sink} sink + {recent}{token} ({seconds:.1f} s)."
    )
    listed = [f"{s.index}:{list(f)}" for s, f in zip(sites, plan.full, strict=True) if f]
    if listed:
        console.print("full (layer:[kv heads]) " + " ".join(listed), soft_wrap=True, markup=False)
    console.print(f"wrote plan.json, scores.csv, heads.csv, manifest.json to {shown(out)}")


def register(app: typer.Typer) -> None:
    app.command(
        "kv-plan",
        no_args_is_help=True,
        epilog="Example: probe kv-plan runs/smollm2 --method retrieval --full-heads 0.25 "
        "--sink 4 --window 256 --out runs/smollm2-plan",
    )(kv_plan_cli)
