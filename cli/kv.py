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


def kv_plan_cli(
    checkpoint: CheckpointArg,
    out: OutOpt,
    method: Annotated[
        str,
        typer.Option(
            help="retrieval (Wu et al. 2024), razor (RazorAttention's echo and induction "
            "scores), duo (DuoAttention's gates trained on passkey prompts), random, streaming "
            "(no full heads) or full (every head full)."
        ),
    ],
    full_heads: Annotated[
        float,
        typer.Option(
            "--full-heads",
            help="Share (0-1) of the key/value heads, over the whole model, that keep the full "
            "cache: round(share x total), at least one when above 0.",
        ),
    ] = 0.25,
    sink: Annotated[int, typer.Option(help="First tokens every streaming head keeps.")] = 4,
    window: Annotated[
        int, typer.Option(help="Most recent tokens every streaming head keeps.")
    ] = 256,
    text: TextOpt = None,
    whole: WholeOpt = False,
    needles: Annotated[int, typer.Option(help="retrieval: needle prompts.")] = 4,
    context: Annotated[int, typer.Option(help="retrieval: tokens per needle prompt.")] = 256,
    period: Annotated[
        int, typer.Option(help="razor: random tokens per copy of the repeated sequence.")
    ] = 64,
    rows: Annotated[int, typer.Option(help="razor: repeated sequences.")] = 8,
    steps: Annotated[
        int, typer.Option(help="duo: Adam steps on the gates (4 passkey prompts each).")
    ] = 40,
    lr: Annotated[float, typer.Option(help="duo: Adam's learning rate on the gates.")] = 0.05,
    l1: Annotated[
        float, typer.Option(help="duo: weight of the L1 penalty on the mean gate.")
    ] = 0.05,
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
    import time

    from probe.files import claim_output
    from probe.kv.plan import METHODS, KVPlan
    from probe.words import did_you_mean

    if method not in METHODS:
        raise ProbeError(f"Unknown --method '{method}'.{did_you_mean(method, METHODS)} "
                         f"Available: {', '.join(METHODS)}.")  # fmt: skip
    if not 0.0 <= full_heads <= 1.0:
        raise ProbeError(f"--full-heads must be a share in [0, 1], got {full_heads}.")
    if sink < 0:
        raise ProbeError(f"--sink must be at least 0, got {sink}.")
    check_positive(window=window, needles=needles, context=context, period=period, rows=rows,
                   steps=steps)  # fmt: skip
    if not 0 < lr < float("inf") or not 0 <= l1 < float("inf"):
        raise ProbeError(f"--lr must be above 0 and --l1 at least 0, both finite; got {lr} and "
                         f"{l1}.")  # fmt: skip
    KVPlan(method, full_heads, sink, window, ())  # sink and window within a plan's range
    check_seed(seed)
    earlier = claim_output(out, WRITES, overwrite, inputs=inputs_of(checkpoint, text))
    from probe.files import open_output
    from probe.kv.duo import DuoSettings
    from probe.kv.methods import check_plannable, make_plan

    duo = DuoSettings(steps=steps, lr=lr, l1=l1)
    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    check_plannable(ckpt.model_cfg)
    limit = ckpt.model_cfg.max_positions
    if method == "razor" and limit is not None and 2 * period + 1 > limit:
        raise ProbeError(
            f"--period {period} makes sequences of {2 * period + 1} tokens (two copies and a "
            f"start), past the model's {limit} learned positions; use --period "
            f"{(limit - 1) // 2} or less."
        )
    prompts = None
    if method == "retrieval":
        prompts = _needle_prompts(ckpt, text, whole, needles, context, seed)
    start = time.perf_counter()
    with console.status(f"kv-plan {method}") as status:
        result = make_plan(ckpt.model, method, full_heads, sink, window, seed=seed,
                           prompts=prompts, period=period, rows=rows,
                           progress=lambda s: status.update(s), duo=duo)  # fmt: skip
    seconds = time.perf_counter() - start
    out = open_output(out, earlier)
    result.plan.write(out / "plan.json")
    from probe.report.files import atomic_write_csv  # a crash or a full disk leaves no half file

    atomic_write_csv(out / "scores.csv", result.scores)
    atomic_write_csv(out / "heads.csv", result.heads)
    write_manifest(out, ckpt, command="kv-plan", method=method,
                   full_share=result.plan.full_share, full_heads_asked=full_heads,
                   sink=sink, window=window, seed=seed, aggregate="max over query heads",
                   seconds=round(seconds, 2), **result.notes,
                   **({"needles": needles, "context": context,
                       "text": str(text) if text else "shipped corpus", "whole": whole}
                      if method == "retrieval" else {}),
                   **({"period": period, "rows": rows} if method == "razor" else {}),
                   **({"steps": steps, "lr": lr, "l1": l1} if method == "duo" else {}))  # fmt: skip
    _show(result.plan, ckpt.model_cfg, seconds, out)


def _needle_prompts(ckpt, text, whole, needles: int, context: int, seed: int):
    from probe.analysis.retrieval import needle_prompts
    from probe.data.text import read_documents

    if ckpt.objective != "causal-lm":
        raise ProbeError(
            f"{ckpt.path}: --method retrieval needs an imported causal language model with a "
            "tokenizer (probe import); use --method razor."
        )
    limit = ckpt.model_cfg.max_positions
    if limit is not None and context > limit:
        raise ProbeError(f"--context {context} is longer than the model's {limit} positions.")
    note_text(text)
    return needle_prompts(read_documents(text, whole=whole), ckpt.tokenizer(), needles, context,
                          seed=seed)  # fmt: skip


def _show(plan, cfg, seconds: float, out) -> None:
    sites = cfg.sites()
    total = sum(len(s.kept_groups) for s in sites)
    kept = sum(len(f) for f in plan.full)
    console.print(
        f"{plan.method}: {kept} of {total} key/value heads keep the full cache; the others keep "
        f"{plan.sink} sink + {plan.window} recent tokens ({seconds:.1f} s)."
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
