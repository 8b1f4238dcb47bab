"""The generic registry (did-you-mean lookups, scoped additions) and the options type (bounds,
study tables, --set strings)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from probe.errors import ProbeError
from probe.options import check, describe, option, parse_sets, read
from probe.registry import Registry


@dataclass(frozen=True)
class Toy:
    name: str
    rank: int = 0


@dataclass(frozen=True)
class ToyOptions:
    period: int = option(64, low=2, help="tokens repeated")
    share: float = option(0.5, low=0.0, high=1.0, help="a share")
    lengths: tuple[int, ...] = option((128,), low=64, help="prompt lengths")
    threads: int = option(1, low=1, high=lambda: 4, help="threads")
    label: str = "x"


def test_registry_lookup_suggests_and_lists_choices():
    reg = Registry("toy method")
    with reg.added(Toy("razor", 2), Toy("retrieval", 1)):
        assert reg.get("razor").rank == 2
        assert reg.names() == ("razor", "retrieval") and "razor" in reg and len(reg) == 2
        with pytest.raises(ProbeError, match=r"Unknown toy method 'razr'\. Did you mean 'razor'"
                           r"\? Available: razor, retrieval\."):  # fmt: skip
            reg.get("razr")
        assert reg.find(3) is None and 3 not in reg
    assert reg.names() == ()  # the block's additions are gone


def test_registry_refuses_two_entries_of_one_name_and_undoes_a_failed_addition():
    reg = Registry("toy method")
    with (
        pytest.raises(ProbeError, match="two toy methods are called 'a'"),
        reg.added(Toy("a"), Toy("a")),
    ):
        pass
    assert reg.names() == ()


def test_options_bounds_each_entry_and_repeats():
    assert check(ToyOptions()) == ToyOptions()
    with pytest.raises(ProbeError, match=r"^s\.toml \[toy\] period must be at least 2 "
                       r"\(tokens repeated\), got 1\.$"):  # fmt: skip
        check(ToyOptions(period=1), "s.toml [toy]")
    with pytest.raises(ProbeError, match=r"share must be from 0 to 1 \(a share\), got 1\.5"):
        check(ToyOptions(share=1.5))
    with pytest.raises(ProbeError, match=r"lengths must be at least 64 .*got 32"):
        check(ToyOptions(lengths=(128, 32)))
    with pytest.raises(ProbeError, match=r"lengths lists a value twice: \[128, 128\]"):
        check(ToyOptions(lengths=(128, 128)))
    with pytest.raises(ProbeError, match=r"^share must be a finite number \(a share\), got nan"):
        check(ToyOptions(share=float("nan")))
    with pytest.raises(ProbeError, match=r"^--threads must be at least 1 and at most 4"):
        check(ToyOptions(threads=5), flags=True)


def test_options_from_a_table_and_from_set_strings_agree():
    table = read(ToyOptions, {"period": 8, "lengths": [64, 256]}, "[toy]")
    sets = parse_sets(ToyOptions, ["period=8", "lengths=64,256"], "toy")
    assert table == check(ToyOptions(**sets)) == ToyOptions(period=8, lengths=(64, 256))
    assert parse_sets(ToyOptions, ["label=word", "share=1"], "toy") == {"label": "word",
                                                                       "share": 1}  # fmt: skip
    with pytest.raises(ProbeError, match=r"Unknown toy option 'perod'\. Did you mean 'period'"):
        parse_sets(ToyOptions, ["perod=3"], "toy")
    with pytest.raises(ProbeError, match=r"toy field 'period' must be an integer"):
        parse_sets(ToyOptions, ["period=many"], "toy")
    with pytest.raises(ProbeError, match=r"--set takes key=value"):
        parse_sets(ToyOptions, ["period"], "toy")
    with pytest.raises(ProbeError, match=r"Unknown \[toy\] field 'nope'"):
        read(ToyOptions, {"nope": 1}, "[toy]")


def test_describe_names_defaults_bounds_and_help():
    text = describe(ToyOptions)
    assert "period = 64 (at least 2): tokens repeated" in text
    assert "share = 0.5 (from 0 to 1): a share" in text
    assert "label = 'x'" in text
