"""A head study's report: results/NAME/report.md with its tables and figures beside it.

It opens with the question and a one-sentence answer carrying its numbers, then the set-up, the
pruning curves and operating points, the agreement between importance estimators, head roles and
the retrieval knock-out (language models), the measured speed of the pruned models, and the
comparison with the published direction of each claim. Rebuilt from the results directory alone
(`probe study report DIR`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probe.errors import ProbeError
from probe.pruning.importance import importance_correlations
from probe.pruning.objectives import primary
from probe.report.pruning_plots import (
    correlation_heatmap,
    importance_heatmap,
    knockout_plot,
    pruning_curve_plot,
    speed_plot,
)
from probe.report.report import MarkdownReport
from probe.schema import ROLE_COLUMNS
from probe.study.documents import read_json
from probe.study.engine.workdir import MANIFEST
from probe.study.heads import evidence as ev
from probe.study.heads.plan import read_head_tables
from probe.study.verdicts.checks import head_verdicts
from probe.study.verdicts.expect import Outcome
from probe.study.verdicts.reproduce import head_reproduction, reference_for
from probe.words import counted


class HeadReport:
    """The report of one results directory: its study description, manifest and tables."""

    def _runtime_note(self) -> str:
        """Where and in what the model ran, when not float32 on the CPU (the reports of
        earlier runs, which record neither, read as they did)."""
        runtime = self.manifest.get("runtime") or {}
        dtype, device = runtime.get("dtype"), str(runtime.get("device", "cpu"))
        parts = []
        if dtype not in (None, "float32"):
            parts.append(f"weights held in {dtype} (statistics summed in float32)")
        if not device.startswith("cpu"):
            parts.append(f"run on {device}")
        return f" {'; '.join(parts).capitalize()}." if parts else ""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        try:
            self.study = read_json(self.out / "study.json")
            self.manifest = read_json(self.out / MANIFEST)
        except ProbeError as exc:
            raise ProbeError(f"'{out}' is not a finished head study run: {exc}") from None
        self.tables = read_head_tables(self.out)
        if "model" not in self.tables:
            raise ProbeError(f"'{out}' has no model table; run the study again to finish it.")
        self.facts = self.tables["model"].iloc[0]
        self.objective = str(self.facts.objective)
        self.metric, self.higher = primary(self.objective)
        self.n_heads = int(self.facts.n_layer * self.facts.n_head)
        self.tolerance = float(self.study["operating"]["tolerance"])
        self.curves = self.tables.get("curves", pd.DataFrame())
        self.ops = (ev.operating_summary(self.curves, self.objective, self.tolerance,
                                         self.n_heads) if not self.curves.empty
                    else pd.DataFrame())  # fmt: skip
        self.speed = ev.speed(self.tables.get("timing", pd.DataFrame()))
        self.signs = ev.speed_signs(self.speed) if not self.speed.empty else pd.DataFrame()

    # ------------------------------------------------------------------ the answer
    def criterion(self) -> str:
        if self.metric == "similarity":
            return f"mean cosine similarity to the unpruned embeddings >= {1 - self.tolerance:.2f}"
        return f"held-out loss within +{self.tolerance:g} nats of the unpruned model's"

    def threshold(self) -> float:
        """Where the primary metric meets the tolerance (from the unpruned model's score)."""
        base = float(self.facts[self.metric])
        return base - self.tolerance if self.higher else base + self.tolerance

    def best(self) -> pd.Series | None:
        mine = self.ops[(self.ops.method != "random") & (self.ops.unit == "head")]
        if mine.empty:
            return None
        keys = ["min_fraction", "max_fraction", "value"]  # ties: the better metric there
        return mine.sort_values(keys, ascending=[False, False, not self.higher]).iloc[0]

    def _speed_at(self, method: str, unit: str, n: int) -> str:
        s = self.speed
        if s.empty:
            return ""
        part = s[(s.method == method) & (s.unit == unit) & (s.n_pruned == n)]
        if part.empty:
            return ""
        ratios = ", ".join(f"{r.speedup:.2f}x tokens/s at batch {r.batch_size}"
                           for r in part.itertuples())  # fmt: skip
        signs = self.signs.set_index("n_pruned").loc[n]
        return (f"{ratios} of the original (of all {counted(int(signs.timings), 'timing')} of "
                f"models with {counted(n, 'head')} removed, {int(signs.faster)} ran faster "
                "than the original "
                "beside them, "
                f"median {signs['median']:.2f}x, sign test p = {signs.p_sign:.2g})")  # fmt: skip

    def timing_noise(self) -> dict[int, float]:
        """Per batch size, how much the unpruned model's own speed varied between its timings
        (one beside each pruned copy): max / min - 1 of its tokens/s. One pruned model's ratio
        closer to 1 than this is not a measured difference on its own (the sign test over all
        pruned models of one size, each paired with the original timed beside it, is)."""
        s = self.speed
        spread = s.groupby("batch_size")["original_tok_s"].agg(lambda x: x.max() / x.min() - 1)
        return {int(b): float(v) for b, v in spread.items()}

    def _noise_text(self) -> str:
        n = int(self.speed.groupby("batch_size").size().min())
        ranges = ", ".join(f"{v:.0%} at batch {b}" for b, v in self.timing_noise().items())
        return f"the original's own speed varied by up to {ranges} over its {counted(n, 'timing')}"

    def answer(self) -> str:
        best = self.best()
        if best is None:
            return "No pruning curves were run."
        rand = self.ops[(self.ops.method == "random") & (self.ops.unit == "head")]
        seeds = int(best.seeds)
        n = int(best.min_heads)
        heads = ev.least_important(self.tables.get("importance", pd.DataFrame()), best.method, n)
        if heads and len(heads) == n:
            which = f": {', '.join(heads)}, the same in every seed"
        elif len(heads) > 6:
            which = f"; {len(heads)} of them among the {n} least important in every seed"
        elif heads:
            which = f"; only {', '.join(heads)} among the {n} least important in every seed"
        else:
            which = ""
        text = (
            f"with {self.criterion()} in every one of {counted(seeds, 'seed')}, "
            f"{best.method} importance "
            f"removes {ev.share_range(best.min_fraction, best.max_fraction)} of the "
            f"{self.n_heads} heads ({n}{which})"
        )
        if not rand.empty:
            r = rand.iloc[0]
            text += f", random rankings {ev.share_range(r.min_fraction, r.max_fraction)}"
        speed = self._speed_at(best.method, best.unit, best.min_heads)
        if speed:
            text += f"; the pruned model runs at {speed}"
        groups = self.ops[(self.ops.method != "random") & (self.ops.unit == "group")]
        if not groups.empty:
            g = groups.iloc[0]
            text += (f"; whole key/value groups by {g.method}: "
                     f"{ev.share_range(g.min_fraction, g.max_fraction)} of the heads")  # fmt: skip
        sentence = self._roles_clause() + text + self._knockout_clause() + "."
        return sentence[0].upper() + sentence[1:]

    def _roles_clause(self) -> str:
        parts = [
            t for t in (self.tables.get("roles"), self.tables.get("retrieval")) if t is not None
        ]
        if not parts:
            return ""
        counts = ev.role_counts(pd.concat(parts), self.n_heads).set_index("role")
        named = [f"{int(counts.heads[r])} {r.replace('_', '-')}" for r in
                 ("induction", "sink", "retrieval") if r in counts.index]  # fmt: skip
        return f"Of {self.n_heads} heads, {', '.join(named)} heads pass their thresholds; "

    def _knockout_clause(self) -> str:
        knockout = self.tables.get("knockout")
        if knockout is None or knockout.empty:
            return ""

        def moves(metric: str, what: str) -> str:
            t = ev.knockout_test(knockout, metric).iloc[-1]
            return (f"{what} from {t.unmasked:.2f} to {t.retrieval_heads:.2f}, against "
                    f"{t.random_min:.2f} to {t.random_max:.2f} for {int(t.k)} random heads "
                    f"(p = {t.p_value:.2f}, {counted(int(t.draws), 'draw')})")  # fmt: skip

        k = int(ev.knockout_test(knockout).iloc[-1].k)
        copy = moves("copy_accuracy", "teacher-forced copy accuracy on needle prompts")
        if "recall" not in knockout.columns:
            return f"; masking the top {k} retrieval heads moves {copy}"
        recall = moves("recall", "the needle recall of the greedy output (Wu et al.'s measure)")
        return f"; masking the top {k} retrieval heads moves {recall}, and {copy}"

    # ------------------------------------------------------------------ sections
    def setup(self, rep: MarkdownReport) -> None:
        f, s = self.facts, self.study
        t = s["text"]
        rep.heading("Set-up")
        rep.bullets([
            f"Model: `{s['source']}` ({f.model_type}), {counted(int(f.n_layer), 'layer')} x "
            f"{int(f.n_head)} query heads ({counted(int(f.n_kv_head), 'key/value head')} "
            f"per layer), d_model {f.d_model}, "
            f"{int(f.parameters):,} parameters ({int(f.attention_parameters):,} in attention). "
            f"Weights sha256 `{self.manifest['source_sha256'][:16]}`.{self._runtime_note()}",
            f"Text: {'`' + t['file'] + '`' if t['file'] else 'the shipped corpus'} "
            f"({counted(int(f.documents), 'document')}), rows of "
            f"{counted(int(f.tokens_per_row), 'token')}; "
            f"{counted(int(t['seeds']), 'disjoint importance split')} (one per seed) and one "
            "scoring split of "
            f"{counted(int(f.rows_per_split), 'row')} ({t['batches']} x {t['batch_size']}).",
            f"Objective: {self.objective}; curves are read by {self.metric}. Unpruned model on "
            f"the scoring split: " + ", ".join(
                f"{k} {f[k]:.4g}" for k in ("similarity", "neighbours", "loss", "perplexity",
                                            "token_accuracy") if k in f and pd.notna(f[k])
            ) + ".",
            f"Seed r estimates importance on split r and seeds the random ranking; heads are "
            "removed one-shot by the ranking (masked, which gives the same outputs as physical "
            "pruning); speed is measured on physically pruned copies, one thread, "
            f"{counted(int(s['timing']['repeats']), 'repeat')}, median.",
        ])  # fmt: skip

    def pruning(self, rep: MarkdownReport) -> None:
        if self.curves.empty:
            return
        rep.heading("How many heads can go")
        for unit, title in (("head", "by query head"), ("group", "by key/value group")):
            part = self.curves[self.curves.unit == unit]
            if part.empty:
                continue
            fig = pruning_curve_plot(part, self.metric, f"{self.study['name']}: {title}",
                                     threshold=self.threshold())  # fmt: skip
            rep.figure(fig, f"pruning_{unit}_{self.metric}.png",
                       f"{self.metric} on the scoring split against the share of heads removed "
                       f"{title}")  # fmt: skip
        if self.metric == "similarity" and "neighbours" in set(self.curves.metric):
            fig = pruning_curve_plot(self.curves, "neighbours", f"{self.study['name']}")
            rep.figure(fig, "pruning_neighbours.png", "share of rows whose nearest other row (by "
                       "cosine) is the same as under the unpruned model")  # fmt: skip
        rep.data(self.curves, "curves.csv", "Every curve point, per method, unit and seed.")
        ops = self.ops
        if self.metric == "loss":  # perplexity beside the loss it is the exponential of
            ops = ops.assign(**{"perplexity there": np.exp(ops.value),
                                "unpruned perplexity": np.exp(ops.reference)})  # fmt: skip
        ops = ops.rename(columns={"value": f"{self.metric} there",
                                  "reference": f"unpruned {self.metric}"})  # fmt: skip
        rep.paragraph(
            f"Operating point: the largest share of heads removed such that "
            f"{self.criterion()} at it and at every smaller share, per seed."
        )
        rep.table(ops, "operating_points.csv", digits=3)
        looser = []
        for factor in (5, 10):
            tol = self.tolerance * factor
            summary = ev.operating_summary(self.curves, self.objective, tol, self.n_heads)
            looser.append(summary.assign(tolerance=tol))
        looser = pd.concat(looser)[["tolerance", "method", "unit", "min_fraction", "max_fraction",
                                    "per_seed"]]  # fmt: skip
        rep.paragraph(f"The same at looser tolerances ({self.metric} moved by up to 5 and 10 "
                      "times the study's), for a fuller picture; the verdicts below use the "
                      "study's own.")  # fmt: skip
        rep.table(looser, "operating_points_looser.csv", digits=3)
        versus = ev.against_random(self.curves, self.objective)
        if not versus.empty:
            rep.paragraph(
                f"Against random rankings: mean {self.metric} over the curve up to half the heads, "
                "one value per seed; p: exact one-sided Mann-Whitney U test that the method's "
                "seeds beat the random seeds."
            )
            rep.table(versus, "against_random.csv", digits=4)

    def importance(self, rep: MarkdownReport) -> None:
        table = self.tables.get("importance")
        if table is None or table.empty:
            return
        rep.heading("Do the estimators agree?")
        first = table[table.seed == table.seed.min()]
        corr = importance_correlations(first)
        rep.figure(correlation_heatmap(corr), "importance_agreement.png",
                   "Spearman rank correlation between estimators over all heads (seed 0; "
                   "entropy negated, so positive means agreement)")  # fmt: skip
        rep.data(corr, "importance_agreement.csv", "Correlations with p-values.")
        stable = ev.seed_stability(table)
        rep.paragraph("How much each ranking depends on its text: Spearman rho between the "
                      "rankings of every pair of seeds (disjoint splits).")  # fmt: skip
        rep.table(stable, "importance_stability.csv", digits=3)
        mean = table.groupby(["layer", "head", "method"], as_index=False, sort=False).value.mean()
        rep.figure(importance_heatmap(mean), "importance_heads.png",
                   "Importance of every head by each estimator (mean over seeds)")  # fmt: skip

    def roles(self, rep: MarkdownReport) -> None:
        roles = self.tables.get("roles")
        retrieval = self.tables.get("retrieval")
        if roles is None and retrieval is None:
            return
        rep.heading("What the heads do")
        parts = [t for t in (roles, retrieval) if t is not None]
        both = pd.concat([p[ROLE_COLUMNS] for p in parts])
        counts = ev.role_counts(both, self.n_heads)
        rep.paragraph(
            "A head counts for a role when its score reaches the threshold (retrieval: exceeds "
            "it, as Wu et al. 2024 count): previous-token and "
            "sink are mean attention on the previous and on the first token; induction is the "
            "mean attention to the token after the current token's earlier occurrence on "
            "repeated random sequences; retrieval is Wu et al. 2024's score and threshold: with "
            "the model decoding greedily after the question, the share of the needle's tokens "
            "the model generates while the head's most-attended key is that token in the "
            "needle, averaged over the prompts the model retrieves (more than half the needle "
            "recalled; the model decodes as many tokens as the needle has, where the authors' "
            "code decodes up to 50 or to a newline, so a needle token copied later is not "
            "counted)."
        )
        rep.table(counts, "role_counts.csv", digits=3)
        from probe.report.attention_plots import role_heatmaps

        shown = both[both.statistic.isin(["previous_token", "induction", "sink", "retrieval"])]
        rep.figure(role_heatmaps(shown), "roles.png", "Role scores of every head")
        rep.data(
            both.rename(columns={"statistic": "role", "value": "score"}),
            "roles.csv",
            "Every head's score for every role.",
        )  # the reader's words: role, score
        if retrieval is not None and len(retrieval):
            rep.paragraph(ev.retrieval_note(retrieval, int(self.study["roles"]["needles"])))
        knockout = self.tables.get("knockout")
        if knockout is not None and len(knockout):
            rep.heading("Removing the retrieval heads", 3)
            rep.paragraph("Fresh needle prompts (not those the scores came from) with the top-k "
                          "retrieval heads masked, against k heads drawn at random from the "
                          "rest; p = (1 + draws at or below) / (1 + draws). Needle recall of "
                          "the greedy output is Wu et al. 2024's measure of retrieval (the "
                          "verdict below uses it); copy accuracy is the teacher-forced share of "
                          "needle tokens predicted right.")  # fmt: skip
            measures = [("recall", "knockout.csv", "knockout.png", "Needle recall of the "
                         "greedy output")] if "recall" in knockout.columns else []  # fmt: skip
            copy_name = "knockout_copy_accuracy" if measures else "knockout"
            measures.append(("copy_accuracy", f"{copy_name}.csv", f"{copy_name}.png",
                             "Teacher-forced copy accuracy"))  # fmt: skip
            for metric, table, figure, title in measures:
                rep.paragraph(f"**{title}.**")
                rep.table(ev.knockout_test(knockout, metric), table, digits=3)
                rep.figure(knockout_plot(knockout, metric), figure,
                           f"{title} with retrieval heads or random heads masked")  # fmt: skip

    def tuning(self, rep: MarkdownReport) -> None:
        rec = ev.tuning_recovery(self.curves) if not self.curves.empty else pd.DataFrame()
        if rec.empty:
            return
        rep.heading("What mask tuning recovers", 3)
        rep.paragraph("The same Fisher ranking pruned with and without mask tuning (Kwon et al. "
                      "2022's procedure: layer by layer, the kept heads rescaled by least squares "
                      "on the pruned model's own inputs to reproduce the unpruned layer's "
                      "output): loss "
                      "increase over the unpruned model, and the share of it tuning recovers, "
                      "per seed.")  # fmt: skip
        rep.table(rec, "tuning_recovery.csv", digits=3)

    def timing(self, rep: MarkdownReport) -> None:
        if self.speed.empty:
            return
        rep.heading("How much faster")
        rep.paragraph("Each physically pruned model timed side by side with the original, one "
                      "thread; `why` says whether the count is a fixed share or the method's "
                      f"operating point. Timing noise: {self._noise_text()}; "
                      "one speed-up closer to 1 than that is not a measured difference on its "
                      "own (the sign test below pools them).")  # fmt: skip
        rep.table(self.speed, "speed.csv", data=self.tables["timing"], digits=3)
        rep.figure(speed_plot(self.tables["timing"]), "speed.png",
                   "tokens/s of each pruned model over the original's")  # fmt: skip
        rep.paragraph("By number of heads removed, over every method and batch size: how many "
                      "pruned copies ran faster than the original timed beside them, and an "
                      "exact two-sided sign test (small p: a real change in speed).")  # fmt: skip
        shown = self.signs.assign(p_sign=self.signs["p_sign"].map(lambda p: f"{p:.2g}"))
        rep.table(shown, "speed_signs.csv", data=self.signs, digits=3)

    def files(self, rep: MarkdownReport) -> None:
        m = self.manifest
        rep.heading("Reproduce")
        rep.bullets([
            f"`probe study run {m['file']}{' --smoke' if m.get('smoke') else ''}` (finished "
            "steps are reused from `steps/`; each step's `done.json` records its options, "
            "seconds and git commit); "
            f"`probe study report {self.out}` rebuilds this page.",
            f"git commit {m.get('git_commit')}, torch {m.get('versions', {}).get('torch')}, "
            f"{m.get('device')}, packages {m.get('packages')}; "
            f"{counted(len(m['steps']), 'step')}, this "
            f"run {m['wall_s']:.0f} s.",
        ])  # fmt: skip


def write_head_report(out: Path | str, comparison=None) -> tuple[Path, list[Outcome]]:
    """Write report.md (and its tables and figures) into the results directory `out`; returns
    its path and the expectations' outcomes."""
    from probe.study.heads.claims import comparison as default_comparison

    report = HeadReport(Path(out))
    s = report.study
    rep = MarkdownReport(report.out, s["title"] or s["name"])
    if s["smoke"]:
        rep.paragraph("**Smoke version** (scaled down for CI): the numbers below are not results.")
    rep.paragraph(f"**Question.** {s['question']}")
    answer_at = len(rep.blocks)
    rep.paragraph(f"**Answer.** {report.answer()}")
    if s["description"]:
        rep.paragraph(s["description"])
    report.setup(rep)
    report.pruning(rep)
    report.tuning(rep)
    report.timing(rep)
    report.importance(rep)
    report.roles(rep)
    (comparison or default_comparison)(report, rep)
    where = str(report.manifest.get("file", s["name"]))
    outcomes = head_verdicts(rep, s, report.tables, where, answer_at)
    report.files(rep)
    ref = reference_for(report.out, s["name"], bool(s["smoke"]))
    if ref is not None:
        rep.paragraph("**Reproduction.** " + head_reproduction(report.tables, report.manifest, ref))
    return rep.write(), outcomes
