"""A feature that needs an optional package (gguf, Ray) says so in one line, with the command that
installs it, where the package is missing: never an ImportError's traceback."""

from __future__ import annotations

import sys

import pytest
from cli_run import exit_code

from probe.errors import ProbeError, optional


@pytest.fixture
def without(monkeypatch):
    """Make `import NAME` fail as it does where the package is not installed."""

    def hide(name: str) -> None:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            monkeypatch.delitem(sys.modules, module)
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: ImportError

    return hide


def test_a_missing_package_is_one_line_naming_the_feature_and_the_install(without):
    without("gguf")
    with pytest.raises(ProbeError) as caught:
        optional("gguf", "Reading a GGUF file")
    assert str(caught.value) == (
        "Reading a GGUF file needs the gguf package, which is not installed: "
        "pip install 'probe[gguf]' (or pip install 'gguf>=0.10')"
    )
    assert optional("json", "anything") is sys.modules["json"]  # installed: the module


def test_importing_a_gguf_file_without_gguf_says_how_to_install_it(without, tmp_path, capsys):
    without("gguf")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    assert exit_code(["import", str(model), "--out", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err
    assert "needs the gguf package" in err and "pip install 'probe[gguf]'" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "ck").exists()


def test_the_ray_executor_without_ray_says_how_to_install_it(without):
    from probe.study.engine.executors import _ray

    without("ray")
    with pytest.raises(ProbeError, match=r"--executor ray needs the ray package.*probe\[ray\]"):
        _ray()
