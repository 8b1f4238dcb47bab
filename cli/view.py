"""`probe view`: one self-contained HTML page of a model's heads (statistics grid, patterns)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from probe_cli.common import (
    BatchSizeOpt,
    DeviceOpt,
    DtypeOpt,
    MaxBatchTokensOpt,
    OverwriteOpt,
    PickleOpt,
    SeedOpt,
    TextOpt,
    WholeOpt,
    check_data_fits,
    check_positive,
    console,
    inputs_of,
    load_model,
    note_text,
    require_heads,
    shown,
)
from probe_cli.rope import (
    RopeAlphaOpt,
    RopeFactorOpt,
    RopeOriginalOpt,
    RopeScalingOpt,
    apply_rope,
    rope_request,
)

from probe.data.task_spec import parse_lengths
from probe.errors import ProbeError
from probe.files import claim_file
from probe.measure.batching import DEFAULT_BATCH_TOKENS
from probe.pruning.choices import ESTIMATORS
from probe.words import counted


def view_cli(
    target: Annotated[
        Path,
        typer.Argument(help="A checkpoint directory, or a study's results directory."),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")],
    task: Annotated[
        str | None, typer.Option("--task", help="Task to show (default: the one trained on).")
    ] = None,
    length: Annotated[
        str | None,
        typer.Option(
            "--length",
            help="Task lengths, one example each (a slider switches): '16' or '8,16' (default: "
            "L and 2L); imported models: tokens per row (default 64).",
        ),
    ] = None,
    text: TextOpt = None,
    whole: WholeOpt = False,
    importance: Annotated[
        str,
        typer.Option(
            help=f"Importance estimator to colour by ({', '.join(ESTIMATORS.names())}; none); "
            "auto: gradient, or ablation for a sentence encoder."
        ),
    ] = "auto",
    cell: Annotated[
        str | None,
        typer.Option(help="Results directory: which cell (index, key prefix or label)."),
    ] = None,
    batch_size: BatchSizeOpt = 16,
    batches: Annotated[int, typer.Option(help="Batches per length for the statistics.")] = 1,
    max_batch_tokens: MaxBatchTokensOpt = DEFAULT_BATCH_TOKENS,
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
    """Write one self-contained HTML page of a model's heads: a layer x head grid coloured by
    entropy, max logit, role scores or importance; click a head for its attention pattern.

    Opens offline in any browser: the data is inlined and nothing is fetched."""
    check_positive(batch_size=batch_size, batches=batches, max_batch_tokens=max_batch_tokens)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ProbeError(f"--out must name an .html file, got '{out}'.")
    if importance not in ("auto", "none", *ESTIMATORS.names()):
        raise ProbeError(ESTIMATORS.unknown(importance, "--importance"))
    widths = parse_lengths(length) if length else None
    claim_file(out, overwrite, inputs=inputs_of(target, text), inside_ok=True)
    if not target.exists():
        raise ProbeError(f"{target} does not exist; give a checkpoint or a results directory.")
    study_dir = (target / "study.toml").is_file() and (target / "manifest.json").is_file()
    rope = rope_request(None if study_dir else target, rope_scaling, rope_factor, rope_original,
                        rope_alpha)  # fmt: skip
    from probe.analysis.view import checkpoint_view
    from probe.data.text import TextOptions
    from probe.report.html.viewer import write_viewer
    from probe.runtime import resolve_device
    from probe.study.grid.viewers import pick_cell

    resolve_device(device)
    title = f"Heads of {target.name or target}"
    if study_dir:
        picked, model = pick_cell(target, cell)
        title, target = f"Heads of {target.name}: {picked.label}", model
    elif cell is not None:
        raise ProbeError("--cell picks a cell of a study's results directory; drop it here.")
    ckpt = load_model(target, device, dtype, allow_pickle)
    require_heads(ckpt)
    rope_used = apply_rope(ckpt, rope)
    if importance == "auto":
        importance = "ablation" if ckpt.objective == "embedding" else "gradient"
    method = None if importance == "none" else importance
    shown_at = widths or ([64] if ckpt.imported else [2 * ckpt.train_cfg.train_len[1]])
    check_data_fits(ckpt, shown_at, batch_size, batches, backward=method is not None,
                    options="--batches, --batch-size or --length",
                    max_batch_tokens=max_batch_tokens)  # fmt: skip
    note_text(text)
    with console.status("measuring the heads"):
        data = checkpoint_view(
            ckpt, title=title, task=task,
            lengths=widths, text=text, whole=whole,
            batch_size=batch_size, batches=batches, importance=method, seed=seed,
            options=TextOptions(width="--length"), max_batch_tokens=max_batch_tokens,
        )  # fmt: skip
    from probe import provenance

    data["provenance"] = provenance.context(model=ckpt.model)  # inlined: device, dtype, versions
    data["provenance"]["rope_scaling"] = rope_used  # instead of the model's own (None: its own)
    write_viewer(data, out)
    n_heads = sum(len(layer["heads"]) for layer in data["layers"])
    console.print(f"wrote {shown(out)}: {counted(len(data['layers']), 'attention site')}, "
                  f"{counted(n_heads, 'head')}, {counted(len(data['examples']), 'example')}; "
                  "open it in a browser")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command(
        "view",
        no_args_is_help=True,
        epilog="Example: probe view runs/copy --out runs/copy/view.html",
    )(view_cli)
