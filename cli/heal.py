"""`probe heal`: recover a pruned model by distillation from the model it was pruned from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from probe_cli.common import (
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    MaxBatchTokensOpt,
    OutOpt,
    OverwriteOpt,
    PickleOpt,
    SeedOpt,
    check_seed,
    checkpoint_given,
    console,
    load_model,
    note_text,
    shown,
    text_given,
    write_manifest,
)

from probe.errors import ProbeError

RESULTS = ("heal.csv", "losses.csv", "heal.png", "manifest.json")


def heal_cli(
    checkpoint: CheckpointArg,
    teacher: Annotated[
        Path,
        typer.Option(
            "--teacher",
            help="The unpruned model the student was pruned from.",
            callback=checkpoint_given,
        ),
    ],
    out: OutOpt,
    tokens: Annotated[
        int, typer.Option("--tokens", help="Training tokens (whole optimizer steps).")
    ] = 131072,
    text: Annotated[
        Path | None,
        typer.Option(
            "--text",
            help="Training text, one document per line (default: the "
            "training part of the shipped manuals corpus, 1.88M tokens).",
            callback=text_given,
        ),
    ] = None,
    eval_text: Annotated[
        Path | None,
        typer.Option(
            "--eval-text",
            help="Held-out text for perplexity (default: the held-out "
            "part of the shipped manuals corpus, other pages).",
            callback=text_given,
        ),
    ] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per row.")] = 512,
    batch_tokens: Annotated[
        int, typer.Option("--batch-tokens", help="Tokens per optimizer step (whole rows).")
    ] = 16384,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW).")] = 1e-4,
    warmup: Annotated[
        float, typer.Option("--warmup", help="Share of the steps warming up linearly.")
    ] = 0.1,
    schedule: Annotated[
        str, typer.Option("--schedule", help="After warm-up: constant, or cosine to lr/10.")
    ] = "constant",
    temperature: Annotated[
        float, typer.Option("--temperature", help="Temperature of both distributions.")
    ] = 1.0,
    hidden_weight: Annotated[
        float,
        typer.Option(
            "--hidden-weight",
            help="Weight of 1 - cos between the two models' "
            "residual streams after every block (0: logits only).",
        ),
    ] = 0.0,
    eval_tokens: Annotated[
        int, typer.Option("--eval-tokens", help="Held-out tokens perplexity is measured on.")
    ] = 32768,
    eval_at: Annotated[
        str | None,
        typer.Option(
            "--eval-at",
            help="Steps to measure after, e.g. '1,4,16' (default: 1, 2, 4, ... and the last).",
        ),
    ] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    max_batch_tokens: MaxBatchTokensOpt = None,
    allow_pickle: PickleOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    """Distill CHECKPOINT (a model `probe prune` made from --teacher) from --teacher: the KL
    divergence of their next-token distributions (Minitron's logit distillation), AdamW with
    warm-up. Writes the healed checkpoint into OUT with heal.csv (held-out perplexity and loss:
    original, pruned, healed after each measured step), losses.csv, heal.png and
    manifest.json. A run stopped for any reason resumes where it last saved when the same
    command is given again."""
    from probe.heal.config import HealConfig

    check_seed(seed)
    cfg = HealConfig(tokens=tokens, seq_len=seq_len, batch_tokens=batch_tokens, lr=lr,
                     warmup=warmup, schedule=schedule, temperature=temperature,
                     hidden_weight=hidden_weight, eval_tokens=eval_tokens,
                     eval_at=_steps(eval_at), seed=seed)  # fmt: skip
    if text is not None and eval_text is not None and text.resolve() == eval_text.resolve():
        raise ProbeError("--text and --eval-text are the same file; held-out perplexity needs "
                         "text the student is not trained on.")  # fmt: skip
    from probe.checkpoint_files import CHECKPOINT_FILES
    from probe.files import check_apart, claim_output
    from probe.heal.state import holding, state_folder

    inputs = {"CHECKPOINT": checkpoint, "--teacher": teacher, "--text": text,
              "--eval-text": eval_text}  # fmt: skip
    check_apart(out, inputs)
    writes = (*CHECKPOINT_FILES, *RESULTS)
    claim_output(out, writes, overwrite, inputs=inputs)
    state_folder(out)  # a file or a link of the resume folder's name: one line, before any work
    student = load_model(checkpoint, device, dtype, allow_pickle)
    original = load_model(teacher, device, dtype, allow_pickle)
    from probe.heal.pair import check_pair

    check_pair(original, student)
    train_docs, heldout_docs = _texts(text, eval_text)
    with holding(out):  # the resume state's folder, one run at a time; results come at the end
        # again, now that no other run writes here: one that finished meanwhile left results
        earlier = claim_output(out, writes, overwrite, inputs=inputs)
        # a saved state of these settings resumes, --overwrite or not (to the same weights as
        # a fresh run); one it cannot resume is refused, or with --overwrite discarded. The
        # earlier results stay until the new ones are written.
        _run(student, original, train_docs, heldout_docs, cfg, out, earlier, device, dtype,
             max_batch_tokens, overwrite, text, eval_text)  # fmt: skip


def _fingerprint(path: Path | None) -> str:
    """A file or checkpoint folder as resolved path, sizes and modification times: a resumed
    run refuses inputs that changed since it was saved."""
    if path is None:
        return "shipped"
    path = Path(path).resolve()
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    parts = [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.is_file()]
    return f"{path} " + " ".join(parts)


def _run(student, original, train_docs, heldout_docs, cfg, out, earlier, device, dtype,
         max_batch_tokens, overwrite, text, eval_text) -> None:  # fmt: skip
    import matplotlib.pyplot as plt
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from probe.checkpoint import save_checkpoint
    from probe.heal.loop import heal
    from probe.heal.state import clear_state
    from probe.interop.staging import staged
    from probe.report.heal_plots import heal_plot
    from probe.runtime import Runtime

    runtime = Runtime.resolve(device, dtype)
    tokenizer = student.tokenizer()  # read once: CHECKPOINT may be gone by the end of the run
    identity = {"teacher": _fingerprint(original.path), "student": _fingerprint(student.path),
                "text": _fingerprint(text), "eval_text": _fingerprint(eval_text),
                "dtype": str(next(student.model.parameters()).dtype)}  # fmt: skip
    columns = (TextColumn("heal"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.description}"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=cfg.steps)

        def show(p) -> None:
            loss = "" if p.loss is None else f"KL {p.loss:.4f}  lr {p.lr:.2e}"
            bar.update(task, completed=p.step, description=f"{loss}  {p.note}".strip())

        result = heal(original.model, student.model, train_docs, heldout_docs,
                      tokenizer, cfg, out, runtime,
                      max_batch_tokens=max_batch_tokens, identity=identity,
                      progress=show, restart=overwrite)  # fmt: skip
    if result.resumed_at:
        console.print(f"resumed the heal run saved in {shown(out)} at step "
                      f"{result.resumed_at} of {cfg.steps}")  # fmt: skip
    meta = {**student.meta, "healed": {"teacher": str(original.path), "tokens":
                                       cfg.steps * cfg.step_tokens, **cfg.to_dict()}}  # fmt: skip
    trained = cfg.steps * cfg.step_tokens
    with staged(out, earlier) as stage:  # all results at once, replacing an earlier run's
        save_checkpoint(stage, student.model, student.task, student.train_cfg, meta,
                        source=student.source, tokenizer=tokenizer)  # fmt: skip
        result.table.to_csv(stage / "heal.csv", index=False)
        result.losses.to_csv(stage / "losses.csv", index=False)
        figure = heal_plot(result.table, result.losses)
        figure.savefig(stage / "heal.png", dpi=120)
        plt.close(figure)
        write_manifest(stage, student, command="heal", teacher=str(original.path),
                       **cfg.to_dict(), text=str(text) if text else "manuals:train",
                       eval_text=str(eval_text) if eval_text else "manuals:heldout",
                       trained_tokens=trained, resumed_at=result.resumed_at,
                       seconds=round(result.seconds, 1), **result.notes)  # fmt: skip
    clear_state(out, keep_folder=True)  # `holding` removes the folder, emptied, at its end
    _notes(cfg, result.notes)
    _show(result.table, out)


def _notes(cfg, notes: dict) -> None:
    """Say where the run did less than was asked."""
    if cfg.step_tokens != cfg.batch_tokens:
        console.print(f"note: each step took {cfg.step_tokens:,} tokens ({cfg.rows_per_step} "
                      f"whole rows of {cfg.seq_len}), not --batch-tokens {cfg.batch_tokens:,}",
                      style="dim")  # fmt: skip
    if cfg.steps * cfg.step_tokens != cfg.tokens:
        console.print(f"note: trained {cfg.steps * cfg.step_tokens:,} tokens (whole steps), "
                      f"not --tokens {cfg.tokens:,}", style="dim")  # fmt: skip
    measured = notes["eval_tokens_measured"]
    if measured < cfg.eval_tokens:
        console.print(f"note: perplexity was measured on {measured:,} held-out tokens, all the "
                      f"held-out text gives, not --eval-tokens {cfg.eval_tokens:,}",
                      style="dim")  # fmt: skip


def _show(table, out) -> None:
    from rich.table import Table

    ppl = table[table.metric == "perplexity"]
    shown_table = Table("stage", "tokens", "held-out perplexity", "loss")
    losses = table[table.metric == "loss"].set_index(["stage", "tokens"]).value
    for row in ppl.itertuples():
        shown_table.add_row(row.stage, f"{row.tokens:,}", f"{row.value:.2f}",
                            f"{losses[(row.stage, row.tokens)]:.4f}")  # fmt: skip
    console.print(shown_table)
    original = float(ppl[ppl.stage == "original"].value.iloc[0])
    pruned = float(ppl[ppl.stage == "pruned"].value.iloc[0])
    healed = float(ppl[ppl.stage == "healed"].value.iloc[-1])
    if pruned > original:
        share = (pruned - healed) / (pruned - original)
        console.print(f"healing recovered {share:.0%} of the perplexity pruning added "
                      f"({pruned:.2f} -> {healed:.2f}; original {original:.2f})")  # fmt: skip
    console.print(f"wrote the healed checkpoint, heal.csv, losses.csv, heal.png and manifest.json "
                  f"to {shown(out)}")  # fmt: skip


def _steps(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ProbeError(f"--eval-at takes step numbers like '1,4,16', got '{text}'.") from None


def _texts(text: Path | None, eval_text: Path | None) -> tuple[list[str], list[str]]:
    """The training and held-out documents: the shipped manuals corpus, or the first 4 MiB of
    each file (`read_documents`, as every command reads --text: a whole 300 MB file would be
    tokenized as one string, tens of GB, and the tokenizer aborts the process)."""
    from probe.data.docs import docs_corpus
    from probe.data.text import read_documents

    for path in (text, eval_text):
        note_text(path)
    train = docs_corpus("train") if text is None else read_documents(text)
    heldout = docs_corpus("heldout") if eval_text is None else read_documents(eval_text)
    return train, heldout


def register(app: typer.Typer) -> None:
    app.command(
        "heal",
        no_args_is_help=True,
        epilog="Example: probe heal runs/smollm2-pruned --teacher runs/smollm2 --tokens 131072 "
        "--out runs/smollm2-healed",
    )(heal_cli)
