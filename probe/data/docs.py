"""The shipped manuals corpus: 2.07 million tokens of English prose from twelve Python projects'
documentation (permissive licences; `corpus/DOCS-SOURCE.md` says which, how it was made and its
checksums), split by page into a training part and a held-out part that share no page.

    train = docs_corpus("train")      # 1,421 pages, one document each (1.88M SmolLM2 tokens)
    heldout = docs_corpus("heldout")  # 147 other pages (0.2M tokens)
    docs_projects("heldout")          # the project of each held-out page: "Django", ...

Healing (`probe heal`) trains on the first and measures perplexity on the second (a healing
study on a de-duplicated sample of it drawn across the projects: `probe.heal.heldout`).
"""

from __future__ import annotations

import lzma
from importlib import resources
from pathlib import Path

from probe.errors import ProbeError

PARTS = ("train", "heldout")
SOURCE = "DOCS-SOURCE.md"  # next to the two files: sources, licences, checksums

# The projects in the order scripts/make_docs_corpus.py writes them (its SOURCES), and how many
# pages of each part come from each: pages are written project by project, so these counts
# label every page. Counted by that script's own `build` over the twelve releases, whose output
# equals the shipped files byte for byte (2026-12-05).
PROJECTS = ("Django", "SQLAlchemy", "Sphinx", "Celery", "Twisted", "Scrapy", "SymPy", "Cython",
            "NetworkX", "pytest", "mypy", "Alembic")  # fmt: skip
PAGES = {
    "train": (534, 139, 112, 69, 103, 48, 132, 47, 55, 129, 35, 18),
    "heldout": (56, 16, 6, 7, 19, 4, 14, 6, 5, 11, 1, 2),
}


def docs_path(part: str) -> Path:
    """The xz file of one part (`train` or `heldout`)."""
    if part not in PARTS:
        raise ProbeError(f"Unknown part '{part}' of the manuals corpus; use {' or '.join(PARTS)}.")
    path = Path(str(resources.files("probe").joinpath("data", "corpus", f"docs_{part}.txt.xz")))
    if not path.is_file():
        raise ProbeError(f"The shipped manuals corpus is missing ({path}); reinstall probe.")
    return path


def docs_corpus(part: str) -> list[str]:
    """The pages of one part, in the order they were written (one document per page)."""
    path = docs_path(part)
    try:
        text = lzma.decompress(path.read_bytes()).decode("utf-8")
    except (lzma.LZMAError, UnicodeDecodeError, OSError) as exc:
        raise ProbeError(f"{path} cannot be read ({exc}); reinstall probe.") from None
    return [line for line in text.split("\n") if line]


def docs_projects(part: str) -> list[str]:
    """The project of each page of one part, in the order of `docs_corpus(part)`."""
    docs_path(part)  # the part's name checked
    return [name for name, count in zip(PROJECTS, PAGES[part], strict=True)
            for _ in range(count)]  # fmt: skip
