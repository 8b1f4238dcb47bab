"""The rotary scaling options `eval`, `inspect`, `generate` and `view` share: run a rotary model,
training-free, with a scaling it was not trained with (`probe.rope_experiment`). Checked, with
the checkpoint's config.json, before torch is imported."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from probe.checkpoint_files import read_config
from probe.errors import ProbeError
from probe.rope import KINDS
from probe.rope_experiment import CONTEXT_FIELD, RopeRequest, check_rotary
from probe.words import did_you_mean

if TYPE_CHECKING:
    from probe.checkpoint import Checkpoint

_PANEL = "Rotary scaling (training-free)"
RopeScalingOpt = Annotated[
    str | None,
    typer.Option(
        "--rope-scaling",
        help="Run the model's rotary layers with this scaling instead of their own: linear, "
        "dynamic, yarn, llama3 or ntk (default: none; the unscaled rotary).",
        rich_help_panel=_PANEL,
    ),
]
RopeFactorOpt = Annotated[
    float | None,
    typer.Option(
        "--rope-factor",
        help="How many times longer the context is made (linear: positions / factor); "
        "linear, dynamic, yarn and llama3 need it.",
        rich_help_panel=_PANEL,
    ),
]
RopeOriginalOpt = Annotated[
    int | None,
    typer.Option(
        "--rope-original",
        help="The context the kind anchors at (yarn, llama3: the original context; dynamic: "
        "the context it scales from); default: the model's training context.",
        rich_help_panel=_PANEL,
    ),
]
RopeAlphaOpt = Annotated[
    float | None,
    typer.Option(
        "--rope-alpha",
        help="ntk: base' = base * alpha ** (d / (d - 2)).",
        rich_help_panel=_PANEL,
    ),
]


def rope_request(checkpoint: Path | None, kind: str | None, factor: float | None,
                 original: int | None, alpha: float | None) -> RopeRequest | None:  # fmt: skip
    """The scaling the options ask for (None: none), checked against the checkpoint's
    config.json (it must have rotary positions) without importing torch."""
    if kind is None:
        for flag, value in (("--rope-factor", factor), ("--rope-original", original),
                            ("--rope-alpha", alpha)):  # fmt: skip
            if value is not None:
                raise ProbeError(f"{flag} needs --rope-scaling (the kind, e.g. linear).")
        return None
    _check_kind(kind)
    for flag, value in (("--rope-factor", factor), ("--rope-alpha", alpha)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ProbeError(f"{flag} must be a finite number above 0, got {value}.")
    if original is not None and original < 1:
        raise ProbeError(f"--rope-original must be a number of positions >= 1, got {original}.")
    needed = "alpha" if kind == "ntk" else "factor" if kind != "default" else None
    if needed is not None and {"factor": factor, "alpha": alpha}[needed] is None:
        raise ProbeError(f"--rope-scaling {kind} needs --rope-{needed}.")
    given: dict[str, Any] = {"factor": factor, "alpha": alpha}
    if original is not None:
        if kind not in CONTEXT_FIELD:
            raise ProbeError(f"--rope-original: rotary scaling kind '{kind}' anchors at no "
                             "context; drop it.")  # fmt: skip
        given[CONTEXT_FIELD[kind]] = original
    for flag, name in (("--rope-factor", "factor"), ("--rope-alpha", "alpha")):
        if given[name] is not None and name not in KINDS[kind].parameters:
            raise ProbeError(f"{flag}: rotary scaling kind '{kind}' takes no {name}; drop it.")
    request = RopeRequest(kind, tuple((k, v) for k, v in given.items() if v is not None))
    if checkpoint is not None and checkpoint.is_dir():
        check_rotary(read_config(checkpoint).get("model", {}), str(checkpoint), "--rope-scaling")
    return request


def _check_kind(kind: str) -> None:
    """A kind the options can give: longrope's per-pair tables need a study file's table."""
    kinds = [k for k in KINDS if k != "longrope"]
    if kind == "longrope":
        raise ProbeError("--rope-scaling longrope needs per-pair factor tables, which options "
                         "cannot give: use a study file's rope_scaling table.")  # fmt: skip
    if kind not in kinds:
        raise ProbeError(f"Unknown --rope-scaling '{kind}'.{did_you_mean(kind, kinds)} "
                         f"Available: {', '.join(kinds)}.")  # fmt: skip


def apply_rope(ckpt: Checkpoint, request: RopeRequest | None) -> dict[str, Any] | None:
    """Set the requested scaling on the loaded model (its context from the checkpoint) and say
    so in one line; returns the scaling as the manifest records it (None: the model's own)."""
    if request is None:
        return None
    from probe_cli.common import console, rope_record, shown

    from probe.model.rescale import with_rope_scaling
    from probe.rope_experiment import note, training_context

    context, source = training_context(ckpt.model_cfg, ckpt.task, ckpt.train_cfg)
    scaling = request.complete(context)
    with_rope_scaling(ckpt.model, scaling)
    console.print(f"note: {shown(note(request, scaling, source))}", style="dim", soft_wrap=True)
    return rope_record(ckpt)
