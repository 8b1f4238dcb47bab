"""The words of a contrast's verdicts (`probe.study.verdicts.contrast`): the sentence a row
gives the answer, the verdicts table with its explanation, the tests' count and the intervals.
"""

from __future__ import annotations

import pandas as pd

from probe.references import published
from probe.significance import ALPHA
from probe.study.verdicts.contrast import WITHIN_NOTE, Contrast, verdict_table
from probe.study.verdicts.stats import (
    fmt_ci,
    fmt_vs,
    mann_whitney_words,
    multiplicity_words,
    sign_flip_words,
)
from probe.words import counted


def sentence(row: pd.Series, per: tuple[str, ...], digits: int = 2) -> str:
    """'1/sqrt(d_k) fits better than unscaled (sort: exact_match sqrt 0.95 vs none 0.74,
    3 vs 3 seeds, p = 0.05, supported)'."""
    group = "".join(f"{row[c]}: " for c in per)
    metric = ("change in " if row["change"] else "") + row["metric"]
    return (
        f"{row['claim']} ({group}{metric} {row['a']} {row['mean_a']:.{digits}f} vs "
        f"{row['b']} {row['mean_b']:.{digits}f}, {_size(row, seeds=True)}, "
        f"p = {_p(row)}, {row['verdict']})"
    )


def _size(row: pd.Series, seeds: bool = False) -> str:
    """'3 vs 3' (with `seeds`: '3 vs 3 seeds'), or a paired row's '9 pairs' and the units it
    dropped."""
    if not _is_paired(row):
        return f"{row['n_a']} vs {counted(int(row['n_b']), 'seed') if seeds else row['n_b']}"
    lost = int(row["unmatched"])
    dropped = f" ({counted(lost, 'unit')} without a partner dropped)" if lost else ""
    return counted(int(row["n_pairs"]), "pair") + dropped


def _is_paired(row: pd.Series) -> bool:
    return "n_pairs" in row and not pd.isna(row["n_pairs"])


def _p(row: pd.Series) -> str:
    """The p the verdict was read from, printed on the same side of ALPHA as it is."""
    estimated = " (Monte-Carlo)" if _is_paired(row) and not row["exact"] else ""
    if row["expect"] == "similar":
        return f"{fmt_vs(_two_sided(row), ALPHA, 3, 'g')} (two-sided){estimated}"
    return fmt_vs(row["p_claim"], ALPHA, 3, "g") + estimated


def _two_sided(row: pd.Series) -> float:
    if "p_two" in row and not pd.isna(row["p_two"]):
        return float(row["p_two"])
    return min(1.0, 2 * min(row["p_claim"], row["p_other"]))


def ci_text(row: pd.Series, arm: str, digits: int = 2) -> str:
    return fmt_ci(row[f"mean_{arm}"], row[f"low_{arm}"], row[f"high_{arm}"], digits)


def section(rep, contrasts: tuple[Contrast, ...], tables: dict[str, pd.DataFrame],
            where: str = "", sides: str = "arms") -> list[str]:  # fmt: skip
    """The report's Verdicts section: one row per claim (and group) with both arms' means and
    95% bootstrap intervals over seeds (or pairs), the p and the verdict, how many tests the
    table makes; the papers the claims come from, quoted from the references file. Returns one
    sentence per verdict (the answer). `sides`: what the compared values are (a head study
    compares methods)."""
    table = verdict_table(contrasts, tables, where)
    if table.empty:
        return []
    rep.heading("Verdicts")
    paired = table["n_pairs"].notna() if "n_pairs" in table else pd.Series(False, table.index)
    units = " or ".join(dict.fromkeys(" and ".join(c.paired) for c in contrasts if c.paired))
    rep.paragraph(" ".join(filter(None, [
        mann_whitney_words(sides) if not paired.all() else "",
        sign_flip_words(sides, units, alone=paired.all(),
                        similar=(table.loc[paired, "expect"] == "similar").any(),
                        estimated=not table.loc[paired, "exact"].all()) if paired.any() else "",
        _interval_note([*table["n_a"], *table["n_b"]], "pairs" if paired.all() else "seeds"),
        multiplicity_words(table["p_claim"].notna().sum(), _decided(table)),
    ])))  # fmt: skip
    shown = []
    for c in contrasts:
        for _, row in table[table["claim"] == c.claim].iterrows():
            group = ", ".join(str(row[k]) for k in c.per)
            shown.append({
                "claim": c.claim + (f" ({group})" if group else ""),
                "metric": c.metric + WITHIN_NOTE[c.within]
                + (" (change from the baseline rows)" if c.baseline else ""),
                "a": f"{row['a']} {ci_text(row, 'a')}", "b": f"{row['b']} {ci_text(row, 'b')}",
                "seeds": _size(row), "p": _p(row), "verdict": row["verdict"],
                "source": published(c.reference).short if c.reference else "",
            })  # fmt: skip
    header = "pairs" if paired.all() else "seeds or pairs" if paired.any() else "seeds"
    rep.table(pd.DataFrame(shown).rename(columns={"seeds": header}), "verdicts.csv")
    sources = sorted({c.reference for c in contrasts if c.reference})
    if sources:
        rep.bullets([_source_line(published(ref)) for ref in sources])
    return [sentence(row, next(c.per for c in contrasts if c.claim == row["claim"]))
            for _, row in table.iterrows() if row["verdict"] != "no data"]  # fmt: skip


def _decided(table: pd.DataFrame) -> list[float]:
    """The p each 'supported' or 'contradicted' verdict was read from."""
    return [p for _, row in table.iterrows() if (p := _decided_p(row)) is not None]


def _decided_p(row: pd.Series) -> float | None:
    """The p a 'supported' or 'contradicted' verdict was read from (None for other verdicts)."""
    verdict = str(row["verdict"])
    if verdict == "supported":
        return float(row["p_claim"])
    if verdict.startswith("contradicted"):
        return _two_sided(row) if row["expect"] == "similar" else float(row["p_other"])
    return None


def _interval_note(counts, units: str = "seeds") -> str:
    """What the intervals beside the means are, for arms of `counts` seeds (or pairs)."""
    if min(counts, default=2) >= 2:
        return f"Means are over {units} with 95% bootstrap intervals."
    if max(counts) < 2:
        return "Each arm has one seed here, so no interval is shown."
    return (f"Means are over {units} with 95% bootstrap intervals (none for an arm with one "
            "seed).")  # fmt: skip


def _source_line(paper) -> str:
    return f"**{paper.short}**: {paper.cite}. {paper.claim} ({paper.claim_source})."
