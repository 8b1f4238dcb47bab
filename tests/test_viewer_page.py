"""The head viewer page: validated data in, one self-contained HTML file out, and (in headless
Chromium, offline) a grid of heads whose patterns are the weights that went in."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from browser import chromium, open_page, skip_reason
from PIL import Image

from probe.errors import ProbeError
from probe.report.html.viewer import viewer_html, write_viewer

N_LAYER, N_HEAD = 3, 4
LENGTHS = (7, 11)
PRUNED = (1, 2)
WORDS = ["<bos>", "the", "cat", "</script><b>&amp;", "on", "'mat'", " ", "and", "it", "slept", "."]


def causal_softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the keys at or before each query: the textbook causal pattern."""
    n = scores.shape[-1]
    masked = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    weights = np.exp(masked - masked.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def synthetic_data(seed: int = 0, lengths: tuple[int, ...] = LENGTHS) -> dict:
    rng = np.random.default_rng(seed)
    examples = []
    for n in lengths:
        tokens = [WORDS[i % len(WORDS)] for i in range(n)]
        patterns = {
            str(layer): {
                str(head): causal_softmax(2 * rng.normal(size=(n, n))).tolist()
                for head in range(N_HEAD)
                if (layer, head) != PRUNED
            }
            for layer in range(N_LAYER)
        }
        examples.append({"label": f"length {n}", "tokens": tokens, "patterns": patterns})
    entropy = rng.uniform(0, 1, (N_LAYER, N_HEAD)).tolist()
    entropy[0][3] = None
    return {
        "title": "A <small> & synthetic model",
        "subtitle": "3 layers x 4 heads, random causal patterns",
        "layers": [
            {"name": f"blocks.{i}.attn", "heads": list(range(N_HEAD))} for i in range(N_LAYER)
        ],
        "statistics": {
            "normalized_entropy": {"label": "normalized entropy", "values": entropy},
            "importance": {"label": "importance", "values": rng.uniform(0, 3, (3, 4)).tolist()},
        },
        "pruned": [list(PRUNED)],
        "examples": examples,
    }


# ---- without a browser


def test_page_is_self_contained():
    page = viewer_html(synthetic_data())
    urls = re.findall(r"https?://[^\s\"'<>)]*", page)
    assert set(urls) <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"<script[^>]*\ssrc\s*=", page, re.IGNORECASE)
    assert not re.search(r"<link\b|@import|\burl\(", page, re.IGNORECASE)
    # the data's "</script>" cannot close the script element it is inlined in
    assert page.count("</script>") == 2
    assert "\\u003c/script\\u003e" in page


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("layers"), "lacks 'layers'"),
        (lambda d: d.update(titel="x"), "Did you mean 'title'"),
        (lambda d: d.update(statistics={}), "at least one statistic"),
        (lambda d: d["layers"][1].update(heads=[0, 0, 1, 2]), "distinct"),
        (lambda d: d["statistics"]["importance"]["values"][2].pop(), "has 3 values"),
        (lambda d: d["statistics"]["importance"]["values"].pop(), "one row per layer"),
        (lambda d: d["statistics"]["importance"]["values"][0].__setitem__(0, "high"), "number"),
        (lambda d: d.update(pruned=[[5, 0]]), "names layer 5"),
        (lambda d: d.update(pruned=[[-1, 0]]), "names layer -1"),
        (lambda d: d.update(pruned=[[0, 9]]), "does not list"),
        (lambda d: d["examples"][0]["patterns"]["0"].update({"0": [[1.0]]}), "expected (7, 7)"),
        (lambda d: d["examples"][0]["patterns"]["0"]["1"][3].__setitem__(0, 0.9), "row 3 sums"),
        (lambda d: d["examples"][1]["patterns"].update({"0": {"7": []}}), "does not list"),
        (lambda d: d["examples"][1].update(tokens=[]), "non-empty list of strings"),
        (lambda d: d.update(title=""), "non-empty string"),
    ],
)
def test_malformed_data_is_refused(change, message):
    data = synthetic_data()
    change(data)
    with pytest.raises(ProbeError, match=re.escape(message)):
        viewer_html(data)


def test_write_viewer_replaces_the_file_atomically(tmp_path):
    target = tmp_path / "view.html"
    target.write_text("old")
    write_viewer(synthetic_data(), target)
    assert target.read_text(encoding="utf-8").startswith("<!doctype html>")
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]
    with pytest.raises(ProbeError):
        write_viewer({"title": "broken"}, target)
    assert target.read_text(encoding="utf-8").startswith("<!doctype html>")


# ---- in headless Chromium


@pytest.fixture(scope="module")
def browser():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with chromium() as opened:
        yield opened


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


@pytest.fixture
def viewer(browser, data, tmp_path):
    path = write_viewer(data, tmp_path / "viewer.html")
    with open_page(path, browser) as opened:
        yield opened
        assert opened.problems() == []


def shown_pattern(page) -> np.ndarray:
    cells = page.eval_on_selector_all(
        "#pattern [data-w]", "cs => cs.map(c => [+c.dataset.q, +c.dataset.k, +c.dataset.w])"
    )
    n = max(q for q, _, _ in cells) + 1
    weights = np.full((n, n), np.nan)
    for q, k, w in cells:
        weights[q, k] = w
    return weights


def test_page_renders_offline_without_complaint(viewer, data):
    assert viewer.problems() == []
    assert viewer.requests == [viewer.page.url]
    cells = viewer.page.eval_on_selector_all(
        ".head-cell", "cs => cs.map(c => [+c.dataset.layer, +c.dataset.head])"
    )
    expected = {(i, h) for i, layer in enumerate(data["layers"]) for h in layer["heads"]}
    assert len(cells) == len(expected) and set(map(tuple, cells)) == expected
    assert viewer.page.locator(".head-cell.pruned").count() == 1
    assert viewer.page.title() == data["title"]


def test_clicking_a_head_shows_its_pattern(viewer, data):
    viewer.page.click('.head-cell[data-layer="2"][data-head="1"]')
    weights = shown_pattern(viewer.page)
    expected = np.array(data["examples"][0]["patterns"]["2"]["1"])
    assert weights.shape == expected.shape == (LENGTHS[0], LENGTHS[0])
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-3)
    np.testing.assert_allclose(weights, expected, atol=1e-5)
    assert np.all(weights[np.triu_indices(LENGTHS[0], 1)] == 0)
    info = viewer.page.inner_text("#head-info")
    assert "blocks.2.attn" in info
    assert f"{data['statistics']['importance']['values'][2][1]:.2f}" in info


def test_the_slider_switches_example_and_keeps_the_head(viewer, data):
    viewer.page.click('.head-cell[data-layer="1"][data-head="3"]')
    viewer.page.fill("#example", "1")
    weights = shown_pattern(viewer.page)
    assert weights.shape == (LENGTHS[1], LENGTHS[1])
    np.testing.assert_allclose(weights, data["examples"][1]["patterns"]["1"]["3"], atol=1e-5)
    assert "length 11" in viewer.page.inner_text("#example-label")
    selected = viewer.page.locator(".head-cell.selected")
    assert (
        selected.get_attribute("data-layer") == "1" and selected.get_attribute("data-head") == "3"
    )
    viewer.page.fill("#example", "0")
    assert shown_pattern(viewer.page).shape == (LENGTHS[0], LENGTHS[0])


def test_hovering_a_weight_names_query_and_key(viewer, data):
    viewer.page.click('.head-cell[data-layer="0"][data-head="0"]')
    viewer.page.hover('#pattern rect[data-q="5"][data-k="3"]')
    tokens, w = data["examples"][0]["tokens"], data["examples"][0]["patterns"]["0"]["0"][5][3]
    tip = viewer.page.locator("#tooltip")
    assert tip.is_visible()
    assert tip.inner_text() == f"query '{tokens[5]}' (5) -> key '{tokens[3]}' (3): {w:.3f}"


def test_a_pruned_head_is_marked(viewer):
    viewer.page.click('.head-cell[data-layer="1"][data-head="2"]')
    assert "pruned" in viewer.page.inner_text("#pattern")
    assert viewer.page.locator("#pattern [data-w]").count() == 0


def test_statistic_menu_and_arrow_keys(viewer, data):
    cell = viewer.page.locator('.head-cell[data-layer="0"][data-head="0"]')
    before = cell.evaluate("c => c.style.background")
    viewer.page.select_option("#statistic", "importance")
    assert cell.evaluate("c => c.style.background") != before
    top = max(max(row) for row in data["statistics"]["importance"]["values"])
    assert f"{top:.2f}" in viewer.page.inner_text("#legend")
    cell.focus()
    viewer.page.keyboard.press("ArrowRight")
    viewer.page.keyboard.press("ArrowDown")
    selected = viewer.page.locator(".head-cell.selected")
    assert (selected.get_attribute("data-layer"), selected.get_attribute("data-head")) == ("1", "1")


def test_screenshot_is_not_blank(viewer):
    viewer.page.click('.head-cell[data-layer="2"][data-head="0"]')
    image = Image.open(io.BytesIO(viewer.page.screenshot(full_page=True))).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 24)
    assert len(colours) >= 3
    assert any(rgb != (255, 255, 255) for _, rgb in colours)


def test_long_example_is_drawn_as_an_image(browser, tmp_path):
    data = synthetic_data(seed=1, lengths=(150,))
    path = write_viewer(data, tmp_path / "long.html")
    with open_page(path, browser) as opened:
        page = opened.page
        page.click('.head-cell[data-layer="0"][data-head="1"]')
        assert page.locator("#pattern image").count() == 1
        assert page.locator("#pattern [data-w]").count() == 0
        box = page.locator("#pattern image").bounding_box()
        cell = box["width"] / 150
        page.mouse.move(box["x"] + 40.5 * cell, box["y"] + 100.5 * cell)
        tokens, w = (
            data["examples"][0]["tokens"],
            data["examples"][0]["patterns"]["0"]["1"][100][40],
        )
        expected = f"query '{tokens[100]}' (100) -> key '{tokens[40]}' (40): {w:.3f}"
        assert page.inner_text("#tooltip") == expected
        assert opened.problems() == []
