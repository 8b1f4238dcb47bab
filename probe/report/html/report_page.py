"""report.html: a study's Markdown report rendered as one self-contained page (its figures
embedded as data URIs, its style inline, nothing fetched), to mail or upload as a CI artifact.
Links to the CSV files beside it stay relative."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

from probe.errors import ProbeError

STYLE = """
:root { color-scheme: light; --ink: #1f2430; --muted: #5b6272; --line: #dfe3ea; --accent: #2e5aac; }
* { box-sizing: border-box; }
body { margin: 0; background: #f5f6f8; color: var(--ink);
  font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 32px 28px 64px; background: #fff;
  min-height: 100vh; box-shadow: 0 0 0 1px var(--line); }
h1 { font-size: 26px; line-height: 1.25; margin: 0 0 18px; }
h2 { font-size: 20px; margin: 34px 0 10px; padding-top: 10px; border-top: 1px solid var(--line); }
h3 { font-size: 16px; margin: 24px 0 8px; }
p, ul { margin: 8px 0 12px; }
li { margin: 3px 0; }
a { color: var(--accent); }
code { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  background: #f1f3f6; padding: 1px 4px; border-radius: 4px; }
pre code { display: block; padding: 10px 12px; overflow-x: auto; }
blockquote { margin: 12px 0; padding: 8px 14px; border-left: 4px solid #e0b94f;
  background: #fdf8ea; color: #4a4230; }
img { max-width: 100%; height: auto; display: block; margin: 12px auto 4px; }
em { color: var(--muted); }
.table-wrap { overflow-x: auto; margin: 10px 0 4px; }
table { border-collapse: collapse; font-size: 13.5px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 10px; vertical-align: top; }
th { background: #f3f5f8; text-align: left; font-weight: 600; }
tr:hover td { background: #fafbfd; }
footer { margin-top: 40px; color: var(--muted); font-size: 13px; }
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
  content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<main>
{body}
<footer>Rendered from report.md by probe; the figures are embedded, the CSV files sit beside this
page.</footer>
</main>
</body>
</html>
"""

_IMG = re.compile(r'<img src="([^"]+)"')
_TABLE = re.compile(r"<table>(.*?)</table>", re.S)


def _embed(folder: Path, body: str) -> str:
    """Replace each relative PNG/SVG image source by a data URI of the file beside the report."""

    def inline(match: re.Match) -> str:
        src = html.unescape(match.group(1))
        if re.match(r"^[a-z]+:", src):
            raise ProbeError(
                f"report.md links an image outside its folder ({src}); keep figures local."
            )
        path = (folder / src).resolve()
        if not path.is_file():
            raise ProbeError(f"report.md shows {src}, which is not in {folder}.")
        kind = {".png": "image/png", ".svg": "image/svg+xml"}.get(path.suffix.lower())
        if kind is None:
            raise ProbeError(f"report.md shows {src}; only PNG and SVG figures can be embedded.")
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'<img src="data:{kind};base64,{data}"'

    return _IMG.sub(inline, body)


def report_html(markdown: str, folder: Path | str) -> str:
    """The HTML page of a Markdown report whose figures lie in `folder`."""
    folder = Path(folder)
    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    body = md.render(markdown)
    body = _TABLE.sub(lambda m: f'<div class="table-wrap"><table>{m.group(1)}</table></div>', body)
    body = _embed(folder, body)
    title = markdown.splitlines()[0].lstrip("# ").strip() if markdown.strip() else "Report"
    return PAGE.format(title=html.escape(title), style=STYLE, body=body)
