"""A head study's `[text]` file is one of `probe study run`'s inputs: an --out that is it or
holds it is refused before anything is written, and the file is left byte for byte."""

from __future__ import annotations

import pytest
from test_head_study_checks import models, mutated, refused  # noqa: F401 (a fixture)

pytest.importorskip("transformers")


@pytest.mark.parametrize("out", ["data", "data/corpus.txt"])
def test_an_out_that_is_or_holds_the_text_file_is_refused(models, tmp_path, capsys, out):  # noqa: F811
    (tmp_path / "data").mkdir()
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    before = corpus.read_bytes()
    file = tmp_path / "study.toml"
    file.write_text(mutated(models["llama"], {"text": {"file": '"data/corpus.txt"'}}))
    err = refused(["study", "run", str(file), "--out", str(tmp_path / out)], capsys)
    assert "which this command reads" in err and str(corpus) in err, err
    assert corpus.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["corpus.txt"]
