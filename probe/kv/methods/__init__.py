"""Key/value-plan methods: how a `KVPlan`'s full heads are chosen, one module each.

A method is a module of this package that declares a `KVMethod` in its `DECLARES`: its name
(`--method`, plan.json's "method"), its help, its options (a frozen dataclass of
`probe.options.option` fields, bounds and help included), the prefix its options carry in a
head study's flat [kv] table (razor's `period` is `razor_period` there), what text it reads
(`prompts`), whether its options fit a model (`fits`), `scores`, the function that gives
every key/value head its score (None for a baseline that picks no heads: `streaming`, `full`),
and, where the method needs them, `choose` (how it picks its full heads from scores of several
statistics: razor's separate induction and echo rankings) and `plan_fields` (the plan fields
its options set: razor's buffer ratio and compensation token). `probe.kv.planning.make_plan`
ranks the scores (by `choose`, else the best heads of its one statistic) and keeps the chosen
heads' full cache; the command line, a head study and the report read everything else from the
declaration, so adding a method is adding one module here.

This package imports without torch (the command line reads it for its help): a method's
computation is imported inside its `scores`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from probe import options as opt
from probe.errors import ProbeError
from probe.fields import field_value
from probe.registry import Registry

# (model, options, seed, sink, window, prompts, say) -> (heads: probe.kv.planning.HEAD_COLUMNS,
# scores: SCORE_COLUMNS, notes: what the scores rest on, for the manifest)
Scorer = Callable[..., tuple[Any, Any, dict]]
# (documents, tokenizer, options, seed) -> the prompts its scores read
Prompter = Callable[[Any, Any, Any, int], list]
# (scores: SCORE_COLUMNS, model config, share or None (the method's own), options) -> per site,
# the key/value heads that keep the full cache
Chooser = Callable[[Any, Any, float | None, Any], tuple[tuple[int, ...], ...]]
# (model config, options, named) -> None, or a ProbeError when the options do not fit the model
# (`named(field)`: how the caller shows an option, "--period" or "[kv] razor_period")
Fitter = Callable[[Any, Any, Callable[[str], str]], None]


@dataclass(frozen=True)
class NoOptions:
    """The options of a method that has none."""


@dataclass(frozen=True)
class KVMethod:
    name: str  # --method and plan.json's "method"
    rank: int  # where it stands in listings: --method's help, messages, a report's rows
    help: str  # what it is, for --method's help ("" when the name says it)
    label: str = ""  # how reports and plots name it ("": the name)
    options: type = NoOptions  # a frozen dataclass of probe.options.option fields
    study_prefix: str = ""  # its options' prefix in a head study's [kv] table (razor_period)
    scores: Scorer | None = None  # None: a baseline, which picks no heads by score
    fixed_share: float | None = None  # a baseline's share of full heads (1: every one, 0: none)
    prompts: Prompter | None = None  # the text prompts its scores read (None: it reads none)
    fits: Fitter | None = None  # whether its options fit a model (None: any options fit)
    per_seed: bool = False  # a study draws its plan again for each seed (random's draw)
    # how it picks full heads (None: the best share by its one statistic; it then needs a share)
    choose: Chooser | None = None
    # options -> the KVPlan fields they set (None: none; razor: buffer_ratio, compensate)
    plan_fields: Callable[[Any], dict[str, Any]] | None = None
    # (option, default) where a head study's default differs from the command's
    study_defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def shown(self) -> str:
        return self.label or self.name

    def fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.options))

    @property
    def prefix(self) -> str:
        """Its options' prefix in a head study's [kv] table (its name where it declares none)."""
        return self.study_prefix or self.name.replace("-", "_")

    def study_keys(self) -> dict[str, str]:
        """Option -> its key in a head study's [kv] table ("period" -> "razor_period")."""
        return {f: f"{self.prefix}_{f}" for f in self.fields()}

    def study_fields(self) -> list[tuple[str, Any, Any]]:
        """Its options as a head study's flat [kv] fields: (key, type, field), the bounds and
        help it declares, its study default where it has one (retrieval's score_needles: 20)."""
        hints = typing.get_type_hints(self.options)
        defaults, keys = dict(self.study_defaults), self.study_keys()
        made = []
        for f in dataclasses.fields(self.options):
            low, high = f.metadata.get("low"), f.metadata.get("high")
            what = f.metadata.get("help", "")
            field = opt.option(defaults.get(f.name, f.default), low=low, high=high,
                               help=f"{self.name}: {what}" if what else self.name)  # fmt: skip
            made.append((keys[f.name], hints[f.name], field))
        return made

    def study_options(self, section: Any) -> dict[str, Any]:
        """Its option values from a head study's [kv] options (razor: period <- razor_period)."""
        return {name: getattr(section, key) for name, key in self.study_keys().items()}

    def read(self, given: Any = None, where: str = "", *, flags: bool = False) -> Any:
        """Its options from an instance, a mapping of option values or None (the defaults),
        checked (`flags`: named as a command's --options)."""
        if given is None:
            given = self.options()
        elif isinstance(given, Mapping):
            unknown = sorted(set(given) - set(self.fields()))
            if unknown:
                raise ProbeError(f"the {self.name} method has no option {unknown[0]!r}; its "
                                 f"options: {', '.join(self.fields()) or 'none'}.")  # fmt: skip
            if not flags:  # from Python: typed as a study file's values are (a command's
                # values arrive typed by their option, or by parse_sets)
                hints = typing.get_type_hints(self.options)
                given = {k: field_value(hints[k], k, v, f"the {self.name} method")
                         for k, v in given.items()}  # fmt: skip
            given = self.options(**given)
        elif not isinstance(given, self.options):
            raise ProbeError(f"the {self.name} method takes {self.options.__name__}, got "
                             f"{type(given).__name__}.")  # fmt: skip
        return opt.check(given, where, flags=flags)

    def extra_fields(self, options: Any) -> dict[str, Any]:
        """The KVPlan fields its `options` set (`plan_fields`; none when it declares none)."""
        return self.plan_fields(options) if self.plan_fields is not None else {}

    def check_fits(self, cfg: Any, options: Any, named: Callable[[str], str] | None = None) -> None:
        """One line when `options` do not fit model `cfg` (`named`: how to show an option)."""
        if self.fits is not None:
            self.fits(cfg, options, named or (lambda f: f))


METHODS: Registry[KVMethod] = Registry("kv-plan method", "probe.kv.methods", order="rank")


def head_methods() -> tuple[str, ...]:
    """The methods that choose heads by a score (every one but the baselines)."""
    return tuple(m.name for m in METHODS if m.scores is not None)


def method_help() -> str:
    """--method's help: each method with what it is ("razor (RazorAttention's ...)")."""
    said = [f"{m.name} ({m.help})" if m.help else m.name for m in METHODS]
    return ", ".join(said[:-1]) + f" or {said[-1]}." if len(said) > 1 else f"{said[0]}."


def options_help() -> str:
    """--set's list: each method's options ("razor period, rows; duo steps, lr, l1")."""
    return "; ".join(f"{m.name} {', '.join(m.fields())}" for m in METHODS if m.fields())
