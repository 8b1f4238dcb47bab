"""`probe eval`: a checkpoint's exact match, token accuracy and loss at each task length (an
imported model: loss and perplexity on text), optionally with a KV plan or a rotary scaling."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    inputs_of,
    load_model,
    note_text,
    shown,
    write_manifest,
)
from probe_cli.kv_eval import (
    KVPlanOpt,
    NeedlesOpt,
    NeedleTokensOpt,
    PrefillOpt,
    check_needle_options,
    eval_kv_plan,
    read_plan,
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

from probe.data.task_spec import parse_lengths
from probe.errors import ProbeError
from probe.files import claim_output, open_output
from probe.measure.batching import DEFAULT_BATCH_TOKENS


def eval_cli(
    checkpoint: CheckpointArg,
    out: OutOpt,
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            help="Task lengths, 'lo:hi' or '8,16' (default 1:32); imported models: tokens per "
            "row of text (default 128).",
        ),
    ] = None,
    text: TextOpt = None,
    whole: WholeOpt = False,
    batch_size: BatchSizeOpt = 64,
    batches: Annotated[int, typer.Option(help="Batches per length.")] = 2,
    max_batch_tokens: MaxBatchTokensOpt = DEFAULT_BATCH_TOKENS,
    seed: SeedOpt = 1234,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
    kv_plan: KVPlanOpt = None,
    needle_tokens: NeedleTokensOpt = None,
    needles: NeedlesOpt = None,
    prefill: PrefillOpt = None,
    rope_scaling: RopeScalingOpt = None,
    rope_factor: RopeFactorOpt = None,
    rope_original: RopeOriginalOpt = None,
    rope_alpha: RopeAlphaOpt = None,
) -> None:
    """Evaluate a checkpoint at each task length; writes OUT/eval.csv."""
    check_positive(batches=batches, batch_size=batch_size, max_batch_tokens=max_batch_tokens)
    check_needle_options(kv_plan, needle_tokens, needles, prefill)
    rope = rope_request(checkpoint, rope_scaling, rope_factor, rope_original, rope_alpha)
    if lengths:
        parse_lengths(lengths)  # task lengths or tokens per row: the same form, checked now
    inputs = inputs_of(checkpoint, text) | ({"--kv-plan": kv_plan} if kv_plan else {})
    earlier = claim_output(out, ("eval.csv", "manifest.json"), overwrite,
                           inputs=inputs, inside_ok=True)  # fmt: skip
    plan = read_plan(kv_plan) if kv_plan is not None else None
    from probe.measure.evaluate import evaluate
    from probe.report.files import atomic_write_csv

    ckpt = load_model(checkpoint, device, dtype, allow_pickle)
    apply_rope(ckpt, rope)
    if plan is not None:
        eval_kv_plan(ckpt, plan, out, earlier, lengths, text, whole, batch_size, batches, seed,
                     max_batch_tokens, needle_tokens, needles, prefill)  # fmt: skip
        return
    if ckpt.imported:
        _eval_text(ckpt, out, earlier, lengths, text, whole, batch_size, batches, seed,
                   max_batch_tokens)  # fmt: skip
        return
    if text is not None:
        check_data_options(ckpt, text, None)
    lengths = lengths or "1:32"
    check_data_fits(ckpt, parse_lengths(lengths), batch_size, batches,
                    max_batch_tokens=max_batch_tokens)  # fmt: skip
    table = evaluate(
        ckpt.model, ckpt.task, parse_lengths(lengths), batch_size=batch_size, n_batches=batches,
        seed=seed, max_batch_tokens=max_batch_tokens,
    )  # fmt: skip
    open_output(out, earlier)
    atomic_write_csv(out / "eval.csv", table)
    write_manifest(
        out, ckpt, command="eval", lengths=lengths, batch_size=batch_size,
        batches=batches, seed=seed, max_batch_tokens=max_batch_tokens,
    )  # fmt: skip
    lo, hi = ckpt.train_cfg.train_len
    wide = table.pivot(index="length", columns="metric", values="value")
    view = Table(title=f"{ckpt.task.name}: trained on lengths {lo}-{hi}")
    for col in ("length", "exact_match", "token_accuracy", "loss", ""):
        view.add_column(col, justify="right")
    for n, row in wide.iterrows():
        where = "trained" if lo <= n <= hi else "unseen"
        view.add_row(
            str(n), f"{row.exact_match:.3f}", f"{row.token_accuracy:.3f}", f"{row.loss:.3f}", where
        )
    console.print(view)
    console.print(f"wrote {shown(out / 'eval.csv')}")


def _eval_text(ckpt, out, earlier, lengths, text, whole, batch_size, batches, seed,
               max_batch_tokens):  # fmt: skip
    """eval of an imported model: its text metrics at each row width."""
    from probe.data.text import read_documents
    from probe.measure.evaluate import evaluate_text
    from probe.report.files import atomic_write_csv

    reference = None
    if ckpt.objective == "embedding" and ckpt.meta.get("pruning"):
        reference = _original(ckpt)
    widths = parse_lengths(lengths or "128")
    check_data_fits(ckpt, widths, batch_size, batches, max_batch_tokens=max_batch_tokens)
    note_text(text)
    docs = read_documents(text, whole=whole)
    table = evaluate_text(ckpt.model, ckpt.tokenizer(), ckpt.objective, docs, widths, batch_size,
                          batches, seed, reference,
                          max_batch_tokens=max_batch_tokens)  # fmt: skip
    open_output(out, earlier)
    atomic_write_csv(out / "eval.csv", table)
    write_manifest(out, ckpt, command="eval", lengths=widths, batch_size=batch_size,
                   batches=batches, seed=seed, text=str(text) if text else "shipped corpus",
                   whole=whole, max_batch_tokens=max_batch_tokens)  # fmt: skip
    wide = table.pivot(index="length", columns="metric", values="value")
    view = Table(title=f"imported {ckpt.source['model_type']} on text ({ckpt.objective})")
    view.add_column("tokens per row", justify="right")
    for col in wide.columns:
        view.add_column(col, justify="right")
    for n, row in wide.iterrows():
        view.add_row(str(n), *(f"{v:.4f}" for v in row))
    console.print(view)
    if ckpt.objective == "embedding":
        against = "the unpruned model at " + ckpt.source["path"] if reference else "itself"
        console.print(f"similarity: cosine of mean-pooled embeddings to {shown(against)}")
    console.print(f"wrote {shown(out / 'eval.csv')}")


def _original(ckpt):
    """The unpruned model an imported checkpoint came from (a pruned sentence encoder is scored
    against its embeddings)."""
    from probe.interop.importer import import_model

    path = Path(ckpt.source["path"])
    if not path.exists():
        raise ProbeError(
            f"{ckpt.path} is a pruned sentence encoder, scored by similarity to the model it came "
            f"from, but that model is no longer at {path}; import it again there."
        )
    first = next(ckpt.model.parameters())  # the original in the pruned model's dtype
    return import_model(path, dtype=first.dtype).model.to(first.device)
