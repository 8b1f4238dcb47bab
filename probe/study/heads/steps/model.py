"""The model step: the model's shape, its parameters, the text it is scored on and its unpruned
metrics; the report's Set-up section presents it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from probe.study.heads.step import Options, Section, StepKind
from probe.study.heads.study import HeadStudy
from probe.words import counted

if TYPE_CHECKING:
    from probe.report.report import MarkdownReport
    from probe.study.heads.findings import Findings
    from probe.study.heads.subject import Subject


def model_facts(subject: Subject, options: Options, given, progress) -> pd.DataFrame:
    """One row: the model's shape, its parameters, the text it is scored on, and its unpruned
    metrics on the scoring split."""
    from probe.pruning.curves import score_batches

    model, cfg = subject.model, subject.model.cfg
    sets, scoring = subject.splits
    counts = model.parameter_counts()
    row = {"source": subject.study.source, "model_type": subject.imported.source["model_type"],
           "objective": subject.objective, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
           "n_kv_head": cfg.kv_heads, "d_model": cfg.d_model, "parameters": counts["total"],
           "attention_parameters": counts.get("attention", 0),
           "rows_per_split": sum(b.inputs.shape[0] for b in scoring),
           "tokens_per_row": scoring[0].inputs.shape[1], "importance_splits": len(sets),
           "documents": len(subject.docs)}  # fmt: skip
    row.update(score_batches(model, scoring))
    return pd.DataFrame([row])


def _plan(study: HeadStudy) -> list[tuple[str, Options]]:
    return [("model", {})]


def runtime_note(manifest: dict) -> str:
    """Where and in what the model ran, when not float32 on the CPU (the reports of earlier
    runs, which record neither, read as they did)."""
    runtime = manifest.get("runtime") or {}
    dtype, device = runtime.get("dtype"), str(runtime.get("device", "cpu"))
    parts = []
    if dtype not in (None, "float32"):
        parts.append(f"weights held in {dtype} (statistics summed in float32)")
    if not device.startswith("cpu"):
        parts.append(f"run on {device}")
    return f" {'; '.join(parts).capitalize()}." if parts else ""


def setup(r: Findings, rep: MarkdownReport) -> None:
    f, s = r.facts, r.study
    t = s["text"]
    pruning = any(name in r.tables for name in ("importance", "curves", "timing"))
    splits = (f"{counted(int(t['seeds']), 'disjoint importance split')} (one per seed) and one "
              "scoring split" if pruning else "a scoring split")  # fmt: skip
    bullets = [
        f"Model: `{s['source']}` ({f.model_type}), {counted(int(f.n_layer), 'layer')} x "
        f"{int(f.n_head)} query heads ({counted(int(f.n_kv_head), 'key/value head')} "
        f"per layer), d_model {f.d_model}, "
        f"{int(f.parameters):,} parameters ({int(f.attention_parameters):,} in attention). "
        f"Weights sha256 `{r.manifest['source_sha256'][:16]}`.{runtime_note(r.manifest)}",
        f"Text: {'`' + t['file'] + '`' if t['file'] else 'the shipped corpus'} "
        f"({counted(int(f.documents), 'document')}), rows of "
        f"{counted(int(f.tokens_per_row), 'token')}; {splits} of "
        f"{counted(int(f.rows_per_split), 'row')} ({t['batches']} x {t['batch_size']}).",
        f"Objective: {r.objective}"
        + (f"; curves are read by {r.metric}" if pruning else "")
        + ". Unpruned model on the scoring split: " + ", ".join(
            f"{k} {f[k]:.4g}" for k in ("similarity", "neighbours", "loss", "perplexity",
                                        "token_accuracy") if k in f and pd.notna(f[k])
        ) + ".",
    ]  # fmt: skip
    if pruning:
        bullets.append(
            "Seed r estimates importance on split r and seeds the random ranking; heads are "
            "removed one-shot by the ranking (masked, which gives the same outputs as physical "
            "pruning); speed is measured on physically pruned copies, one thread, "
            f"{counted(int(s['timing']['repeats']), 'repeat')}, median."
        )
    rep.heading("Set-up")
    rep.bullets(bullets)


DECLARES = StepKind("model", 0, model_facts, _plan, reports=(Section("set-up", 10, setup),))
