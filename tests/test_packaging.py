"""What a wheel ships: every package under probe/ (and the CLI), so `pip install .` runs as an
editable checkout does."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_on_disk_is_listed_for_the_wheel():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "probe").rglob("__init__.py")
    }
    listed = set(setup["packages"])
    assert on_disk - listed == set(), "packages a wheel would leave out"
    assert listed - on_disk == {"probe_cli"}
