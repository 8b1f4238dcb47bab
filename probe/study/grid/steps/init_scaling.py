"""init_scaling: the sqrt(d_k) argument at initialization, the same table in every cell
(`init_scaling`), and its report section."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.analysis.scaling import init_scaling
from probe.report.attention_plots import scaling_init_figure
from probe.report.report import MarkdownReport
from probe.study.grid.steps.base import Section, Step, StepContext
from probe.words import counted


@dataclass(frozen=True)
class InitScalingOptions:
    d_ks: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)  # key widths, independent of the cell
    ns: tuple[int, ...] = (128, 1024)  # keys per query
    n_queries: int = 512
    seed: int = 0


def run(ctx: StepContext, opts: InitScalingOptions) -> dict[str, pd.DataFrame]:
    """The sqrt(d_k) argument at initialization (`probe.analysis.scaling.init_scaling`): scores
    of unit-variance q and k under each fixed scale, against d_k. It does not depend on the cell,
    so every cell gives the same table (computing it takes well under a second)."""
    table = init_scaling(opts.d_ks, opts.ns, n_queries=opts.n_queries, seed=opts.seed)
    # "scale" would collide with a grid factor model.scale among the cell's identity columns
    return {"init_scaling": table.rename(columns={"scale": "score_scale"})}


def section(rep: MarkdownReport, table: pd.DataFrame) -> list[str]:
    """The sqrt(d_k) argument at initialization: one cell's table (every cell computes the same)."""
    first = table[table["cell"] == table["cell"].iloc[0]] if "cell" in table else table
    first = first[["d_k", "n", "score_scale", "statistic", "value"]]
    first = first.rename(columns={"score_scale": "scale"})
    rep.heading("At initialization: why sqrt(d_k)")
    rep.paragraph(
        "Scores q.k of independent unit-variance q and k have variance d_k; each scale multiplies "
        "them by 1/sqrt(d_k), 1 or 1/d_k. Measured on random vectors (no training)."
    )
    rep.figure(scaling_init_figure(first), "init_scaling.png", "Score variance, entropy, "
               "near-one-hot rows and softmax Jacobian against d_k")  # fmt: skip
    wanted = ["score_var", "normalized_entropy", "p_max_gt_0.9", "softmax_jacobian_norm"]
    n, d_k = int(first["n"].max()), int(first["d_k"].max())
    at = first[(first["n"] == n) & (first["d_k"] == d_k) & first["statistic"].isin(wanted)]
    wide = at.pivot_table(index="scale", columns="statistic", values="value").reset_index()
    rep.table(wide, "init_scaling.csv", data=first, digits=3,
              caption=f"At d_k = {d_k} and n = {counted(n, 'key', grouped=False)} per "
              "query.")  # fmt: skip
    rows = wide.set_index("scale")
    if {"sqrt", "none"} <= set(rows.index) and "p_max_gt_0.9" in rows:
        var, hot = rows["score_var"], 100 * rows["p_max_gt_0.9"]
        if "softmax_jacobian_norm" in rows:
            jac = rows["softmax_jacobian_norm"]
            rep.paragraph(
                f"The mean softmax Jacobian norm is not the gauge of vanishing gradients: unscaled "
                f"it is {jac['none']:.3f} against {jac['sqrt']:.3f} scaled, because it averages "
                "saturated rows (a one-hot row has a zero Jacobian) with rows split between a few "
                "keys (norms up to 0.5), and an evenly spread row has a small Jacobian too "
                f"(about 1/sqrt(n) = {n**-0.5:.3f}). The share of near-one-hot rows, "
                f"{hot['none']:.0f}% unscaled against {hot['sqrt']:.0f}% scaled, counts the rows "
                "whose gradient has vanished."
            )
        return [
            f"At initialization (d_k = {d_k}, n = {n}): unscaled scores have variance "
            f"{var['none']:.0f} and {hot['none']:.0f}% of softmax rows are near one-hot "
            f"(p_max > 0.9); scaled by 1/sqrt(d_k), variance {var['sqrt']:.2f} and "
            f"{hot['sqrt']:.0f}%."
        ]
    return []


STEP = Step(
    "init_scaling", InitScalingOptions, run, ("init_scaling",),
    "score variance, entropy, one-hot rows and softmax gradient at initialization against d_k, "
    "per fixed scale",
    sections=(Section("init_scaling", 10, ("init_scaling",),
                      lambda rep, given: section(rep, given.tables["init_scaling"])),),
)  # fmt: skip
