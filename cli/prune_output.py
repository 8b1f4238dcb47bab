"""What `probe prune` prints about one pruning run: metrics and parameters before and after,
forward time side by side, the pruned-vs-masked logit gap, how the run held the model, and
what the timing did."""

from __future__ import annotations

from probe_cli.common import console
from rich.table import Table

from probe.words import counted


def report(result, fraction: float, imported: bool, sizes: list[int] | None,
           share: float | None) -> None:  # fmt: skip
    """Print the comparison of a `prune_and_compare` result; `sizes`: the batch sizes asked to
    be timed (None: no timing)."""
    _tables(result, fraction)
    if result.in_place:
        why = "an imported model" if imported else "a pruned copy would not fit beside it"
        console.print(f"pruned in place ({why}): no second copy of the weights; original and "
                      "pruned were timed one after the other, not interleaved")  # fmt: skip
    if sizes is not None:
        console.print(_timing_line(result, sizes, share))


def _timing_line(result, sizes: list[int], share: float | None) -> str:
    """What the timing did, in one line: repeats, batch sizes, its budget and what it took."""
    runs = result.timing.groupby("batch_size")["repeats"].first()
    timed = [int(size) for size in runs.index]
    line = "timing: " + ", ".join(f"{counted(int(n), 'repeat')} at batch size {size}"
                                  for size, n in runs.items())  # fmt: skip
    if result.timing_budget is None:
        line += ", no budget (--repeats given)"
    else:
        line += f", budget {result.timing_budget:.1f} s"
        if share is not None:
            line += f" ({share:.0%} of the {result.work_seconds:.1f} s the pruning took)"
    line += f"; took {result.timing_seconds:.1f} s"
    left = [s for s in sizes if s not in timed]
    if left:
        line += f"; batch sizes {', '.join(map(str, left))} left out to keep to the budget"
    if len(runs) and int(runs.min()) < 3:
        line += "; under 3 repeats the speed-ups are rough (--timing-budget or --repeats for more)"
    return line


def removed_share(result, fraction: float) -> str:
    """The heads removed, of those the model had, and the share achieved ("90 of 270 heads (33%;
    25% asked)"), with the share asked for where rounding (per key/value group with --uniform
    or --unit group, per layer with --scope layer) made it another."""
    removed = len(result.removed)
    total = removed + sum(len(site.kept_heads) for site in result.model.cfg.sites())
    achieved = removed / total if total else 0.0
    text = f"{removed} of {counted(total, 'head')} ({achieved:.0%}"
    if f"{achieved:.0%}" != f"{fraction:.0%}":
        text += f"; {fraction:.0%} asked"
    return text + ")"


def _tables(result, fraction: float) -> None:
    import torch

    wide = result.metrics.pivot(index="metric", columns="variant", values="value")
    view = Table(title=f"before / after pruning {removed_share(result, fraction)}")
    view.add_column("metric")
    variants = ("original", "masked", "pruned")
    for v in variants:
        view.add_column(v, justify="right")
    for metric in wide.index:
        view.add_row(metric, *(f"{wide.loc[metric, v]:.4f}" for v in variants))
    console.print(view)
    params = result.parameters.pivot(index="part", columns="variant", values="count")
    view = Table(title="parameters")
    for col in ("part", "original", "pruned", "pruned / original"):
        view.add_column(col, justify="right" if col != "part" else "left")
    for part, row in params.iterrows():
        ratio = row.pruned / row.original if row.original else float("nan")
        view.add_row(part, f"{row.original:,.0f}", f"{row.pruned:,.0f}", f"{ratio:.2f}")
    console.print(view)
    if not result.timing.empty:
        t = result.timing.pivot_table(
            index=["batch_size", "part"], columns="variant", values=["seconds", "min_seconds"]
        )
        view = Table(
            title="forward time, median ms (speed-up = original / pruned; the min is the "
            "steadier figure on a busy machine)"
        )
        for col in ("batch", "part", "original", "masked", "pruned", "speed-up", "by min"):
            view.add_column(col, justify="right")
        for (size, part), row in t.iterrows():
            med, low = row["seconds"], row["min_seconds"]
            view.add_row(
                str(size), part, *(f"{med[v] * 1e3:.2f}" for v in variants),
                f"{med.original / med.pruned:.2f}x", f"{low.original / low.pruned:.2f}x",
            )  # fmt: skip
        console.print(view)
    dtype = next(result.model.parameters()).dtype
    note = "" if dtype == torch.float32 else (
        f" ({str(dtype).removeprefix('torch.')} arithmetic: pruned and masked round in a "
        "different order; in float32 they agree to about 1e-5)")  # fmt: skip
    console.print(f"max |pruned - masked| logit: {result.max_logit_gap:.2e}{note}")
