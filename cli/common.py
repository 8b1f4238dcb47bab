"""What every command shares: the console, option types, and turning errors into one line."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from probe_cli.preflight import (  # check_positive, check_seed: re-exported (their old home)
    at_least_one,
    check_positive,
    check_seed,  # noqa: F401
    checkpoint_given,
    dtype_given,
    seed_given,
    text_given,
)
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from probe.errors import Interrupted, ProbeError
from probe.measure.batching import DEFAULT_BATCH_TOKENS

if TYPE_CHECKING:  # nothing here imports torch: `probe --help` prints without loading it
    from probe.checkpoint import Checkpoint

LOG_WIDTH = 10_000  # columns of output that goes to a pipe or a file: no table is ever cut


class _Console(Console):
    """A console as wide as the terminal it prints to; into a pipe or a log (not a terminal, and
    no COLUMNS set) as wide as a table needs, so its numbers are printed in full, never as
    `0.…` cut to 80 columns."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is not None or self.is_terminal:
            return size
        return ConsoleDimensions(LOG_WIDTH, size.height)


console = _Console()
err_console = _Console(stderr=True)


def shown(value: object) -> str:
    """`value` as text for a console line: a path or name with brackets is printed as written,
    never read as Rich markup (which would drop it, or fail on a stray closing tag)."""
    return escape(str(value))


def _as_flags(params: list) -> list:
    """A boolean flag is shown as `--overwrite` (or `--timing / --no-timing`), not followed by
    `<bool>`: it takes no value. Covers every flag, the generated --help included."""
    for param in params:
        if getattr(param, "is_flag", False) and not param.count and param.metavar is None:
            param.metavar = ""
    return params


class Group(TyperGroup):
    """`probe` and `probe study`: command groups whose (and whose commands') flags are shown as
    flags in the help, and whose usage errors are one line."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Click's usage errors (a missing option or argument, an unknown option or command, a
        value of the wrong type) are one line on stderr and exit code 2, like every other
        error, instead of Typer's usage and boxed message; --help, --version and a command
        given no arguments print the help as before."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except typer.Abort:
            err_console.print("[bold red]error:[/] aborted", highlight=False)
            sys.exit(1)
        except Exception as exc:
            if not _is_click_error(exc):
                raise
            if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help
                err_console.print(f"[bold red]error:[/] {shown(_one_line(exc))}",
                                  highlight=False, soft_wrap=True)  # fmt: skip
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def get_params(self, ctx):
        return _as_flags(super().get_params(ctx))

    def get_command(self, ctx, cmd_name: str):
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, Group):
            _as_flags(command.get_params(ctx))
        return command


def _is_click_error(exc: Exception) -> bool:
    """A usage error (or another ClickException) of the Click that Typer carries inside it,
    known by its class's name: Typer does not export the class."""
    return any(c.__name__ == "ClickException" for c in type(exc).__mro__)


def _one_line(exc) -> str:
    """A Click error as one sentence, and where the command's help is."""
    text = " ".join(exc.format_message().split())
    text = text if text.endswith((".", "?", ")")) else text + "."
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return text
    listed = "commands" if isinstance(ctx.command, TyperGroup) else "options"
    return f"{text} ({ctx.command_path} --help lists the {listed})"


CheckpointArg = Annotated[
    Path,
    typer.Argument(
        help="Checkpoint directory (model.safetensors + config.json).", callback=checkpoint_given
    ),
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Directory to write results into.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.", callback=seed_given)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="Weights' dtype: float32, bfloat16 or float16 (default: the checkpoint's own; "
        "statistics are summed in float32 either way).",
        callback=dtype_given,
    ),
]
LengthsOpt = Annotated[
    str, typer.Option("--lengths", help="Task lengths: 'lo:hi' (inclusive) or '8,16,32'.")
]
PickleOpt = Annotated[
    bool, typer.Option("--allow-pickle", help="Allow loading pickle weights (runs code: trust it).")
]
BatchSizeOpt = Annotated[
    int, typer.Option("--batch-size", help="Examples per batch.", callback=at_least_one)
]
MaxBatchTokensOpt = Annotated[
    int,
    typer.Option(
        "--max-batch-tokens",
        callback=at_least_one,
        help="Tokens one forward (and backward) pass holds: every batch runs in micro-batches "
        "of whole examples up to this many tokens and the statistics are summed over them, so "
        "--batch-size sets what a score averages over and this the memory "
        f"(default {DEFAULT_BATCH_TOKENS}).",
    ),
]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace the results of an earlier run in --out.")
]


def inputs_of(checkpoint: Path, text: Path | None = None) -> dict[str, Path]:
    """What a command reads, which its output must keep apart from, by the option it came
    from (named in a refusal): the model, its --text."""
    return {"CHECKPOINT": checkpoint, **({} if text is None else {"--text": text})}


def require_heads(ckpt: Checkpoint) -> None:
    """A model whose every head was pruned has no attention to measure."""
    if not any(s.kept_heads for s in ckpt.model_cfg.sites()):
        raise ProbeError(
            f"{ckpt.path}: every attention head was pruned, so there is nothing to measure."
        )


def rope_record(ckpt: Checkpoint) -> dict[str, Any] | None:
    """What a manifest records: the rotary scaling the model runs with instead of the one in
    its checkpoint (kind and parameters), or None where it runs with its own."""
    running = ckpt.model.cfg.rope_scaling
    return None if running == ckpt.model_cfg.rope_scaling else running.to_dict()


def write_manifest(out: Path, ckpt: Checkpoint, **settings) -> None:
    """OUT/manifest.json: the command, its settings, the checkpoint's config, the rotary scaling
    it ran with instead of its own (None: its own) and provenance (the device recorded is the
    one the model ran on, `--device auto` resolved)."""
    from probe.provenance import context
    from probe.report.files import atomic_write_json

    atomic_write_json(
        out / "manifest.json",
        {"command": settings.pop("command"), "checkpoint": str(ckpt.path), "settings": settings,
         "model": ckpt.model_cfg.to_dict(), "rope_scaling": rope_record(ckpt), **describe(ckpt),
         **context(model=ckpt.model)},
    )  # fmt: skip


def load_model(checkpoint: Path, device: str, dtype: str | None, allow_pickle: bool) -> Checkpoint:
    """The checkpoint's model on `device` in `dtype` (None: the dtype it was saved in), both
    checked and resolved once (`probe.runtime.Runtime`)."""
    from probe.checkpoint import load_checkpoint
    from probe.runtime import Runtime

    runtime = Runtime.resolve(device, dtype)
    return load_checkpoint(checkpoint, runtime=runtime, allow_pickle=allow_pickle)


def describe(ckpt: Checkpoint) -> dict:
    """What a manifest records about a checkpoint's data: its task, or the import source."""
    if ckpt.task is not None:
        return {"task": ckpt.task.to_dict()}
    return {"source": ckpt.source}


TextOpt = Annotated[
    Path | None,
    typer.Option(
        "--text",
        help="Imported models: a UTF-8 text file, one document per line (default: the shipped "
        "corpus of Python standard-library docstrings).",
        callback=text_given,
    ),
]
WholeOpt = Annotated[
    bool, typer.Option("--whole", help="Imported models: read --text as one document.")
]
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", help="Imported models: tokens per row of text.")
]


def check_data_options(ckpt: Checkpoint, text: Path | None, lengths: str | None) -> None:
    """--text goes with imported models, --lengths with models trained on a task."""
    if ckpt.imported and lengths:
        raise ProbeError(
            f"{ckpt.path} is an imported model: it reads text (--text, --max-tokens), not task "
            "lengths; drop --lengths."
        )
    if not ckpt.imported and text is not None:
        raise ProbeError(
            f"{ckpt.path} was trained on the task '{ckpt.task.name}'; --text is for imported "
            "models (probe import). Drop --text."
        )


def check_data_fits(ckpt: Checkpoint, widths: list[int], batch_size: int, batches: int,
                    sets: int = 1, backward: bool = False,
                    options: str = "--batches, --batch-size or --lengths",
                    max_batch_tokens: int | None = None) -> None:  # fmt: skip
    """Refuse, before any batch is made, data a command cannot hold: `sets` x `batches` batches
    per width (task lengths, or tokens per row of text) of `batch_size` rows, and a forward pass
    (with `backward`, and its gradients) over the longest, in micro-batches of
    `max_batch_tokens` tokens (None: the whole batch at once), with activations in the
    model's dtype; the message names the `options` that make it smaller."""
    from probe.data.tasks import sequence_length
    from probe.measure.evaluate import form_for
    from probe.measure.memory import check_batches

    form = form_for(ckpt.model_cfg.arch)
    seqs = [n if ckpt.imported else sequence_length(ckpt.task, form, n) for n in widths]
    if max_batch_tokens is not None:
        options += " (or --max-batch-tokens)"
    dtype = next(ckpt.model.parameters()).dtype
    check_batches(ckpt.model_cfg, sets * batches * len(widths), batch_size, max(seqs), backward,
                  f"a smaller {options}", max_batch_tokens, dtype)  # fmt: skip


def note_text(text: Path | None) -> None:
    """Say so when only the beginning of a large --text file is read."""
    from probe.data.text import read_note

    note = read_note(text)
    if note:
        console.print(f"note: {shown(note)}", style="dim", soft_wrap=True)


def text_data(ckpt: Checkpoint, text: Path | None, whole: bool, max_tokens: int,
              batch_size: int, batches: int, seed: int, n_importance: int = 1,
              reference: bool = True, width: str = "--max-tokens"):  # fmt: skip
    """Importance sets and a scoring set of text batches for an imported checkpoint; `width`
    is the command's option for tokens per row (inspect: --lengths), named in its messages."""
    from probe.data.text import TextOptions, read_documents
    from probe.measure.evaluate import text_splits_for

    docs = read_documents(text, whole=whole)
    return text_splits_for(ckpt.model, ckpt.tokenizer(), ckpt.objective, docs, max_tokens,
                           batch_size, batches, n_importance, seed, reference,
                           TextOptions(width=width))  # fmt: skip


def launching(nproc: int, device: str, oversubscribe: bool = False) -> bool:
    """True in the process that is to start `nproc` ranks (not in a rank itself), once it has
    checked the machine can hold them (`check_process_count`)."""
    check_positive(nproc=nproc)
    if nproc == 1 or "WORLD_SIZE" in os.environ:
        return False
    from probe.training.launch import check_process_count
    from probe.training.train import resolve_device

    check_process_count(nproc, resolve_device(device), oversubscribe)
    return True


def relaunch(nproc: int) -> None:
    """Run this same command (without --nproc) as `nproc` ranks of one process group, once the
    command's options have all been checked here (see `launching`). A rank that fails is
    reported in its own one line, and its exit status becomes this one's."""
    from probe.training.launch import launch

    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    outcome = launch(args, nproc)
    text = _last_words(outcome.stderr)
    if outcome.code == 0:
        sys.stderr.write(text)  # warnings rank 0 gave
        return
    if outcome.code < 0:
        try:
            name = signal.Signals(-outcome.code).name
        except ValueError:
            name = f"signal {-outcome.code}"
        text = f"error: rank {outcome.rank} was killed by {name}"
        text += " (out of memory?)\n" if name == "SIGKILL" else "\n"
    elif not text:
        text = f"error: rank {outcome.rank} stopped with exit status {outcome.code}\n"
    if outcome.code == 130 and not text.startswith("interrupted:"):
        raise Interrupted()
    sys.stderr.write(text)
    sys.stderr.flush()
    raise typer.Exit(outcome.code if outcome.code in (1, 2, 130) else 1)


def _last_words(stderr: str) -> str:
    """What a rank said last: its one-line error (or interruption note) when it wrote one, else
    all of its stderr (a --debug traceback, a crash)."""
    lines = stderr.splitlines(keepends=True)
    said = [i for i, line in enumerate(lines) if line.startswith(("error:", "interrupted:"))]
    return "".join(lines[said[-1] :]) if said else stderr


NprocOpt = Annotated[
    int,
    typer.Option(
        "--nproc",
        callback=at_least_one,
        help="Processes to run in (at most one per CPU core, or per GPU with --device cuda; "
        "NCCL on GPUs, gloo on the CPU).",
    ),
]
OversubscribeOpt = Annotated[
    bool,
    typer.Option(
        "--oversubscribe", help="With --nproc: start more processes than there are CPU cores."
    ),
]


def stats_progress() -> Progress:
    """A transient progress bar with a note field, for the statistics commands."""
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=True)


def int_list(spec: str, what: str) -> list[int]:
    """Positive whole numbers from "8,16,32" (one line naming `what` otherwise)."""
    try:
        values = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ProbeError(
            f"{what} must be whole numbers separated by commas, got '{spec}'."
        ) from None
    if not values or min(values) < 1:
        raise ProbeError(
            f"{what} must be positive whole numbers separated by commas, got '{spec}'."
        )
    return values


def fmt_stat(value, digits: int = 2) -> str:
    """A statistic in a table: `digits` decimals, "-" for none or NaN."""
    return "-" if value is None or value != value else f"{value:.{digits}f}"
