"""Open a local HTML file in headless Chromium, offline, and collect what went wrong.

Uses Playwright's Python package with Debian's /usr/bin/chromium (never a downloaded browser: no
`playwright install`). Every request whose URL is not file:// is aborted and recorded; console
messages of type error or warning and uncaught page errors are recorded too.

    reason = skip_reason()            # None, or why no browser test can run here
    if reason:
        pytest.skip(reason)
    with chromium() as browser:       # one browser for many pages (launching takes ~1 s)
        with open_page("page.html", browser) as opened:
            opened.page.click(".head-cell")
            assert not opened.problems()
    with open_page("page.html") as opened:   # or a browser of its own
        ...
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the browser: Debian's, or $PROBE_CHROMIUM; set empty, the browser tests run as on a machine
# without one (.ci/run's first test run, which proves they skip)
CHROMIUM = Path(os.environ.get("PROBE_CHROMIUM", "/usr/bin/chromium"))


def skip_reason() -> str | None:
    """Why browser tests cannot run here (None when they can)."""
    if importlib.util.find_spec("playwright") is None:
        return "browser test: the playwright package is not installed (pip install playwright)"
    if os.environ.get("PROBE_CHROMIUM") == "":
        return "browser test: no Chromium (PROBE_CHROMIUM is set empty)"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"browser test: no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@dataclass
class OpenedPage:
    """A loaded page and everything it complained about or tried to fetch."""

    page: Any  # playwright.sync_api.Page
    console: list[str] = field(default_factory=list)  # "error: ..." / "warning: ..."
    page_errors: list[str] = field(default_factory=list)  # uncaught exceptions
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    blocked: list[str] = field(default_factory=list)  # the ones that were not file://

    def problems(self) -> list[str]:
        """Console errors and warnings, page errors and network attempts, one line each."""
        return (
            [f"console {line}" for line in self.console]
            + [f"page error: {line}" for line in self.page_errors]
            + [f"network request (blocked): {url}" for url in self.blocked]
        )


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium (playwright.sync_api.Browser), closed on exit."""
    reason = skip_reason()
    if reason:
        raise RuntimeError(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_page(
    path: Path | str, browser: Any = None, viewport: tuple[int, int] = (1280, 800)
) -> Iterator[OpenedPage]:
    """Load the file at `path` offline; the page's context is closed on exit."""
    if browser is None:
        with chromium() as own, open_page(path, own, viewport) as opened:
            yield opened
        return
    width, height = viewport
    context = browser.new_context(
        viewport={"width": width, "height": height}, offline=True, service_workers="block"
    )
    try:
        page = context.new_page()
        opened = OpenedPage(page)

        def record(url: str) -> None:
            if url not in opened.blocked:
                opened.blocked.append(url)

        def route(request_route: Any) -> None:
            url = request_route.request.url
            if url.startswith("file://"):
                request_route.continue_()
            else:
                record(url)
                request_route.abort()

        def on_request(request: Any) -> None:  # also what the route never sees (data: is local)
            opened.requests.append(request.url)
            if not request.url.startswith(("file://", "data:")):
                record(request.url)

        context.route("**/*", route)
        page.on("request", on_request)
        page.on(
            "console",
            lambda message: (
                message.type in ("error", "warning")
                and opened.console.append(f"{message.type}: {message.text}")
            ),
        )
        page.on("pageerror", lambda error: opened.page_errors.append(str(error)))
        page.goto(Path(path).resolve().as_uri(), wait_until="load")
        yield opened
    finally:
        context.close()
