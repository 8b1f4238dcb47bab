"""Words in messages: counts ("1 head", "2 heads", "1,000 batches", never "1 heads") and
suggestions ("Did you mean 'copy'?")."""

from __future__ import annotations

import difflib

IRREGULAR = {"batch": "batches", "process": "processes", "index": "indices", "matrix": "matrices"}


def plural(noun: str) -> str:
    """The plural of an English noun of probe's messages: head -> heads, batch -> batches."""
    if noun in IRREGULAR:
        return IRREGULAR[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def counted(n: int, noun: str, many: str | None = None, *, grouped: bool = True) -> str:
    """`n` and the noun in the number it takes: counted(1, "head") -> "1 head",
    counted(1200, "token") -> "1,200 tokens" ("1200 tokens" unless `grouped`); `many` gives an
    irregular plural."""
    number = f"{n:,}" if grouped else f"{n}"
    return f"{number} {noun if n == 1 else (many or plural(noun))}"


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """' Did you mean 'x'?' when a close match exists (case aside: 'LINEAR' is 'linear'),
    else ''."""
    by_case = {str(c).lower(): str(c) for c in choices}
    if str(word).lower() in by_case:
        return f" Did you mean '{by_case[str(word).lower()]}'?"
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""
