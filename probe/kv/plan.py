"""`KVPlan`: per attention site, the key/value heads that keep the full cache; every other one is
a streaming head that keeps the first `sink` tokens and the last `window` (StreamingLLM, Xiao et
al. 2024; DuoAttention, Xiao et al. 2025). Plans are per key/value head, so the query heads of a
grouped-query group move together. Written as `plan.json`; every field is checked on reading and
against the model it is applied to, with one line naming the problem."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.fields import shown
from probe.files import atomic_write_text, check_input_file
from probe.kv.methods import METHODS

FORMAT = 1
# the last two are optional (plans written before them have neither)
FIELDS = ("format", "method", "full_share", "sink", "window", "full", "buffer_ratio",
          "compensate")  # fmt: skip
# how a prompt enters a plan's cache (`probe.kv.evaluate.Prefill`), the papers' first
PREFILLS = {
    "full": "the prompt with full attention, then the streaming heads cut (the papers')",
    "chunked": "the prompt in chunks, the streaming heads cut after each (DuoAttention's)",
    "masked": "streaming heads see only sink + window at every position (StreamingLLM's)",
}
# the most tokens a sink or window may count: far past any context, and small enough that
# positions minus the window stay within torch's int64 (a larger one only means "every token")
MAX_TOKENS = 2**40


@dataclass(frozen=True)
class Prefill:
    """How a prompt goes into a plan's cache: `mode` one of PREFILLS; `chunk` the tokens per call
    of the chunked mode (`probe.kv.evaluate.prefilled` fills a cache by it)."""

    mode: str = "full"
    chunk: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in PREFILLS:
            raise ProbeError(f"unknown prefill '{self.mode}'; use one of {', '.join(PREFILLS)}.")
        chunk = self.chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_TOKENS:
            raise ProbeError(f"a prefill chunk is a whole number of tokens from 1 to 2**40, got "
                             f"{chunk!r}.")  # fmt: skip


@dataclass(frozen=True)
class KVPlan:
    method: str  # how the full heads were chosen (a name of probe.kv.methods.METHODS)
    full_share: float  # the share of key/value heads asked to keep the full cache, 0-1
    sink: int  # tokens at the start every streaming head keeps
    window: int  # most recent tokens every streaming head keeps (itself included)
    # per site (in `ModelConfig.sites()` order), the key/value heads (original group ids) that
    # keep the full cache
    full: tuple[tuple[int, ...], ...]
    # RazorAttention's buffer (Tang et al. 2024): a streaming head keeps the last
    # max(window, ceil(n / buffer_ratio)) of the n tokens so far (0: the last `window`)
    buffer_ratio: float = 0.0
    # RazorAttention's compensation token: what a streaming head dropped, folded into one key and
    # value (their means) that counts as many tokens as it holds in the softmax
    compensate: bool = False
    # the plan.json it was read from (None: made in memory), for messages; not part of the plan
    source: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ProbeError(METHODS.unknown(self.method))
        if not 0.0 <= self.full_share <= 1.0:
            raise ProbeError(f"full_share must be in [0, 1], got {self.full_share}.")
        if self.sink < 0 or self.window < 1:
            raise ProbeError(
                f"a streaming head keeps sink >= 0 and window >= 1 tokens, got sink {self.sink}, "
                f"window {self.window}."
            )
        ratio = self.buffer_ratio
        if isinstance(ratio, bool) or not (ratio == 0 or 1 <= ratio < float("inf")):
            raise ProbeError(f"buffer_ratio must be 0 (a fixed window) or a number >= 1 (the "
                             f"buffer is 1/buffer_ratio of the tokens), got "
                             f"{ratio!r}.")  # fmt: skip
        if not isinstance(self.compensate, bool):
            raise ProbeError(f"compensate must be true or false, got {self.compensate!r}.")
        if max(self.sink, self.window) > MAX_TOKENS:
            big = "sink" if self.sink > MAX_TOKENS else "window"
            raise ProbeError(
                f"{big} {getattr(self, big)} is past the most tokens a plan counts (2**40); "
                "a window longer than the text already keeps every token."
            )

    def streaming(self, site: int, groups: tuple[int, ...]) -> tuple[int, ...]:
        """The key/value heads among `groups` (original ids, in cache order) that stream."""
        return tuple(g for g in groups if g not in self.full[site])

    def check(self, cfg: Any, where: str | None = None) -> None:
        """One line when the plan does not fit model `cfg` (site count, group ids), naming
        `where` (default: the plan's file)."""
        where = where or (f"the plan {self.source}" if self.source else "the plan")
        sites = cfg.sites()
        if len(self.full) != len(sites):
            raise ProbeError(
                f"{where} lists {len(self.full)} attention sites but the model has {len(sites)}; "
                "make the plan from this model (probe kv-plan)."
            )
        if self.compensate:
            self._check_compensation(cfg, where)
        for site, full in zip(sites, self.full, strict=True):
            unknown = sorted(set(full) - set(site.kept_groups))
            if unknown:
                raise ProbeError(
                    f"{where}: {site.name} has no key/value heads {unknown} (it keeps "
                    f"{list(site.kept_groups)}); make the plan from this model (probe kv-plan)."
                )

    @staticmethod
    def _check_compensation(cfg: Any, where: str) -> None:
        """A compensation token has no position (for score biases), is not soft-capped, and at a
        sliding-window site would fold in keys the site's own window hides anyway."""
        pe = getattr(getattr(cfg, "pe", None), "value", None)
        what = (f"{pe} score biases" if pe in ("alibi", "t5", "fire") else
                "soft-capped scores" if cfg.attn_softcap is not None else
                "sliding-window layers" if cfg.sliding_window is not None else None)  # fmt: skip
        if what is not None:
            raise ProbeError(f"{where} folds dropped keys into a compensation token, which probe "
                             f"does not define for {what}; make it with compensate "
                             "off.")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        full = [list(f) for f in self.full]
        return {"format": FORMAT, "method": self.method, "full_share": self.full_share,
                "sink": self.sink, "window": self.window, "full": full,
                "buffer_ratio": self.buffer_ratio, "compensate": self.compensate}  # fmt: skip

    def write(self, path: Path) -> Path:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: str | Path) -> KVPlan:
        """A plan from `plan.json` (or a directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "plan.json"
        check_input_file(path, "the plan.json of probe kv-plan")  # a FIFO would block the read
        try:
            data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_repeats)
        except FileNotFoundError:
            raise ProbeError(f"{path} does not exist; write a plan with `probe kv-plan`.") from None
        except ProbeError as e:
            raise ProbeError(f"{path}: {e}") from None
        # ValueError: a JSON error, or an integer of more digits than Python converts;
        # RecursionError: arrays nested thousands deep
        except (OSError, ValueError, RecursionError) as e:
            raise ProbeError(f"{path} is not a readable plan.json: {e}") from None
        form = data.get("format") if isinstance(data, dict) else None
        if isinstance(form, bool) or form != FORMAT:
            raise ProbeError(f"{path} is not a plan.json of format {FORMAT}.")
        extra = sorted(set(data) - set(FIELDS))
        if extra:
            raise ProbeError(f"{path}: unknown fields {extra}; a plan.json has {list(FIELDS)}.")
        try:
            full = data["full"]
            if not isinstance(full, list) or not all(isinstance(s, list) for s in full):
                raise TypeError("full must be a list of lists of key/value head ids")
            full = tuple(tuple(_whole(g, "a key/value head id") for g in site) for site in full)
            for i, site in enumerate(full):
                if min(site, default=0) < 0 or len(set(site)) != len(site):
                    raise ProbeError(f"site {i} lists {list(site)}: key/value head ids must be "
                                     "distinct and >= 0.")  # fmt: skip
            share = data["full_share"]
            if isinstance(share, bool) or not isinstance(share, int | float):
                raise TypeError(f"full_share must be a number, got {share!r}")
            ratio = data.get("buffer_ratio", 0.0)
            if isinstance(ratio, bool) or not isinstance(ratio, int | float):
                raise TypeError(f"buffer_ratio must be a number, got {ratio!r}")
            return cls(str(data["method"]), float(share), _whole(data["sink"], "sink"),
                       _whole(data["window"], "window"), full, float(ratio),
                       data.get("compensate", False), source=path)  # fmt: skip
        except ProbeError as e:  # a field out of range (a ValueError too): its own line
            raise ProbeError(f"{path}: {e}") from None
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ProbeError(
                f"{path}: a field is missing or of the wrong type ({shown(e)})."
            ) from None


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct (json keeps the last of a repeated key silently)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen = [k for k, _ in pairs]
        twice = sorted({k for k in seen if seen.count(k) > 1})
        raise ProbeError(f"the field {twice[0]!r} appears twice; keep one.")
    return data


def _whole(value: Any, what: str) -> int:
    """A JSON whole number (not a bool, a float or a string), else a TypeError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a whole number, got {value!r}")
    return value
