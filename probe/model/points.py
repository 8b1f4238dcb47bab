"""Named points inside the model where a function may read or replace what flows through, named
after the module path as TransformerLens names its hook points (`blocks.3.attn.heads`).

Every attention sub-layer `P` (`blocks.3.attn`, `blocks.3.cross`, `encoder.0.attn`) has

    P.resid_pre  [batch, seq, d_model]   the residual stream the sub-layer adds to (before its
                                         input norm; for `blocks.N.attn`, block N's input)
    P.args       dict                    the attention call's arguments (x, context, q_pos,
                                         k_pos, key_mask, cache, stream); read only
    P.mix        [head] or None          under a key/value plan, per query head the weight of
                                         full attention against streaming attention
                                         (DuoAttention); None (the default): streaming only
    P.heads      [batch, q, head*d_head] the heads' outputs after their gates, going into W_O
    P.out        [batch, seq, d_model]   the attention's output (after W_O)
    P.update     [batch, seq, d_model]   what the sub-layer adds to the stream (`out` through
                                         the output norm, where sandwich or branch norms have one)

and every block `B` (`blocks.3`, `encoder.0`) has `B.resid_post` [batch, seq, d_model], its output.

A module declares its points (`point_names()`) and calls `at(self.points, name, value)` at each,
only when `self.points` is not None, so a model with nothing attached pays one attribute check
per point. Functions are attached only inside `with model.intervene({name: fn}):` (or an
`Intervention` attached and removed by hand): a function gets the value and returns None (the
value goes on) or a replacement; on leaving the block, exception or not, nothing stays attached.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from probe.errors import ProbeError
from probe.words import did_you_mean

Fn = Callable[[Any], Any]


def at(points: dict[str, Fn] | None, name: str, value: Any) -> Any:
    """`value`, or what the function attached at `name` (if any) returns in its place."""
    fn = points.get(name) if points is not None else None
    if fn is None:
        return value
    out = fn(value)
    return value if out is None else out


def table(root: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Every point under `root`: full name -> (the module that calls it, its local name)."""
    found: dict[str, tuple[nn.Module, str]] = {}
    for path, module in root.named_modules():
        names = getattr(module, "point_names", None)
        for local in names() if callable(names) else ():
            found[f"{path}.{local}" if path else local] = (module, local)
    return found


class Intervention:
    """Functions attached at named points of `root` ({name: fn}), checked when made; attached
    by `with` (or `attach()`) and removed on leaving it (or by `remove()`)."""

    def __init__(self, root: nn.Module, fns: Mapping[str, Fn]) -> None:
        points = table(root) if fns else {}  # (nothing to look up: no cost)
        for name in fns:
            if name not in points:
                kinds = sorted({re.sub(r"\.\d+\.", ".N.", n) for n in points})
                raise ProbeError(
                    f"Unknown point '{name}'.{did_you_mean(name, list(points))} Points: "
                    f"{', '.join(kinds) or 'none'}."
                )
        self.attached = [(name, *points[name], fn) for name, fn in fns.items()]
        self.live = False

    def attach(self) -> Intervention:
        done = []
        try:
            for name, module, local, fn in self.attached:
                if module.points is not None and local in module.points:
                    raise RuntimeError(
                        f"a function is already attached at '{name}'; attach one per point"
                    )
                module.points = {**(module.points or {}), local: fn}
                done.append((module, local))
        except BaseException:
            _detach(done)
            raise
        self.live = True
        return self

    def remove(self) -> None:
        if self.live:
            _detach([(module, local) for _, module, local, _ in self.attached])
            self.live = False

    def __enter__(self) -> Intervention:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _detach(pairs: list[tuple[nn.Module, str]]) -> None:
    for module, local in pairs:
        rest = {k: f for k, f in (module.points or {}).items() if k != local}
        module.points = rest or None
