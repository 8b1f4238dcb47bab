"""Rebuild probe/data/corpus/docs_{train,heldout}.txt.xz: English prose from 12 manuals.

The text is the prose of the documentation shipped in the source releases (sdists) on PyPI of
twelve permissively licensed Python projects (`SOURCES`: Django, SQLAlchemy, Sphinx, ...).
Each reStructuredText page is one document: its code blocks, directives, tables and headings are
dropped, inline markup is reduced to its text, and the remaining paragraphs that read as prose
are joined with single spaces into one line. A page goes to the held-out part when the SHA-256 of
its path ends in a byte below 26 (about one page in ten), to the training part otherwise, so the
two parts never share a page (a page whose text appeared before is left out).

    python3 -m pip download --no-deps --no-binary :all: -d SDISTS NAME==VERSION ...  # SOURCES
    python3 scripts/make_docs_corpus.py SDISTS           # writes the two files
    python3 scripts/make_docs_corpus.py SDISTS --check   # exit 1 if they would change

See probe/data/corpus/DOCS-SOURCE.md for the licences and the files' checksums.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import re
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "probe" / "data" / "corpus"

# (sdist file name, its SHA-256 on PyPI, folder of its manual inside the archive, licence)
SOURCES = (
    ("Django-5.1.4.tar.gz",
     "de450c09e91879fa5a307f696e57c851955c910a438a35e6b4c895e86bedc82a",
     "Django-5.1.4/docs/", "BSD-3-Clause"),
    ("sqlalchemy-2.0.36.tar.gz",
     "7f2767680b6d2398aea7082e45a774b2b0767b5c8d8ffb9c8b683088ea9b29c5",
     "sqlalchemy-2.0.36/doc/build/", "MIT"),
    ("sphinx-8.1.3.tar.gz",
     "43c1911eecb0d3e161ad78611bc905d1ad0e523e4ddc202a58a821773dc4c927",
     "sphinx-8.1.3/doc/", "BSD-2-Clause"),
    ("celery-5.4.0.tar.gz",
     "504a19140e8d3029d5acad88330c541d4c3f64c789d85f94756762d8bca7e706",
     "celery-5.4.0/docs/", "BSD-3-Clause"),
    ("twisted-24.11.0.tar.gz",
     "695d0556d5ec579dcc464d2856b634880ed1319f45b10d19043f2b57eb0115b5",
     "twisted-24.11.0/docs/", "MIT"),
    ("scrapy-2.12.0.tar.gz",
     "d66d6e76009b12447604196875a463b61d10721140032a8084a0a52df7f4788f",
     "scrapy-2.12.0/docs/", "BSD-3-Clause"),
    ("sympy-1.13.3.tar.gz",
     "b27fd2c6530e0ab39e275fc9b683895367e51d5da91baa8d3d64db2565fec4d9",
     "sympy-1.13.3/doc/", "BSD-3-Clause"),
    ("cython-3.0.11.tar.gz",
     "7146dd2af8682b4ca61331851e6aebce9fe5158e75300343f80c07ca80b1faff",
     "cython-3.0.11/docs/", "Apache-2.0"),
    ("networkx-3.4.2.tar.gz",
     "307c3669428c5362aab27c8a1260aa8f47c4e91d3891f48be0141738d8d053e1",
     "networkx-3.4.2/doc/", "BSD-3-Clause"),
    ("pytest-8.3.4.tar.gz",
     "965370d062bce11e73868e0335abac31b4d3de0e82f4007408d242b4f8610761",
     "pytest-8.3.4/doc/", "MIT"),
    ("mypy-1.13.0.tar.gz",
     "0291a61b6fbf3e6673e3405cfcc0e7650bebc7939659fdca2702958038bd835e",
     "mypy-1.13.0/docs/", "MIT"),
    ("alembic-1.14.0.tar.gz",
     "b00892b53b3642d0b8dbedba234dbf1924b69be83a9a769d5a624b01094e304b",
     "alembic-1.14.0/docs/", "MIT"),
)  # fmt: skip
PAGES = (".txt", ".rst")  # reStructuredText pages
HELD_OUT_BELOW = 26  # last byte of sha256(path) < 26 of 256: about 10% of the pages

MIN_WORDS = 8  # shorter paragraphs are headings, labels or signatures
MAX_SYMBOLS = 0.08  # share of characters outside letters, digits, space and .,;:'"!?()-


def clean_inline(text: str) -> str:
    """reST inline markup reduced to the words a reader sees."""
    text = re.sub(r":[\w:.-]+:`~?([^`<]*?)\s*<[^`>]*>`", r"\1", text)  # :role:`title <target>`
    text = re.sub(r":[\w:.-]+:`~?!?([^`]*)`", lambda m: m.group(1).split(".")[-1], text)
    text = re.sub(r"`([^`<]*?)\s*<[^`>]*>`__?", r"\1", text)  # `text <url>`_
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`]*)`_{0,2}", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*", r"\1", text)
    text = re.sub(r"\|(\w[\w-]*)\|", r"\1", text)  # |substitution|
    text = text.replace("\\", "")
    return re.sub(r"\s+", " ", text).strip()


# directives whose body is code, markup or machine-made, never prose (others, such as note,
# warning, versionadded, method or attribute, hold the reader's text and are read)
_DROPPED = (
    "code code-block sourcecode literalinclude highlight doctest testcode testoutput testsetup "
    "testcleanup ipython plot math image figure toctree raw include csv-table list-table table "
    "graphviz digraph inheritance-diagram productionlist only tabularcolumns index"
)
DROPPED = frozenset(_DROPPED.split())


def prose_paragraphs(page: str) -> list[str]:
    """The page's paragraphs that read as prose, in order: blocks of lines separated by blank
    lines, without headings, tables, comments, the bodies of code-like directives (`DROPPED`,
    `auto*`) or literal blocks (after a paragraph ending in `::`), and with list markers and
    field names taken off."""
    out: list[str] = []
    block: list[str] = []
    skip_indent: int | None = None  # inside a dropped indented body: its parent's indent

    def flush() -> None:
        if block:
            text = " ".join(line.strip() for line in block)
            block.clear()
            text = re.sub(r"^(?:[-*+] |#\. |\d+\. |:[^:`]+:\s+)", "", text)
            if text.endswith("::"):
                text = text[:-1]  # "as follows::" reads "as follows:"
            text = clean_inline(text)
            if is_prose(text):
                out.append(text)

    for raw in page.splitlines():
        line = raw.rstrip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not line or indent > skip_indent:
                continue
            skip_indent = None
        if not line:
            flush()
            continue
        stripped = line.strip()
        if stripped.startswith(".."):  # a directive, comment, target or footnote
            flush()
            directive = re.match(r"\.\. ([\w:-]+)::", stripped)
            name = directive.group(1).split(":")[-1] if directive else ""
            if not directive or name in DROPPED or name.startswith("auto"):
                skip_indent = indent
            continue  # a kept directive's argument is a signature or a version, not prose
        if re.fullmatch(r"([=\-~^\"'`#*+:.])\1{2,}( +\1+)*", stripped) or stripped.startswith(
            ("+-", "+=")
        ):
            block.clear()  # a heading's underline (the heading goes too) or a table border
            continue
        if re.fullmatch(r":[\w -]+:", stripped):  # a directive's option without a value
            continue
        block.append(line)
        if stripped.endswith("::"):
            flush()
            skip_indent = indent
    flush()
    return out


def is_prose(text: str) -> bool:
    """Sentences, not code, tables, headings or signatures."""
    if len(text.split()) < MIN_WORDS or not text[:1].isupper() or text[-1] not in ".!?:":
        return False
    if text.startswith((">>>", "...", "|")):
        return False
    symbols = sum(1 for c in text if not (c.isalnum() or c.isspace() or c in ".,;:'\"!?()-"))
    return symbols / len(text) <= MAX_SYMBOLS


def held_out(path: str) -> bool:
    return hashlib.sha256(path.encode()).digest()[-1] < HELD_OUT_BELOW


def build(sdists: Path) -> tuple[str, str]:
    """The training and held-out parts: one page per line, pages in archive-path order."""
    parts: tuple[list[str], list[str]] = ([], [])
    seen: set[str] = set()
    for name, sha256, folder, _licence in SOURCES:
        archive = sdists / name
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != sha256:
            raise SystemExit(f"{archive} is not the release this corpus is made from (sha256)")
        with tarfile.open(archive) as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and m.name.startswith(folder)
                 and m.name.endswith(PAGES)),
                key=lambda m: m.name,
            )  # fmt: skip
            for member in members:
                page = tar.extractfile(member).read().decode("utf-8")
                text = " ".join(prose_paragraphs(page))
                if text and text not in seen:  # a page shipped twice is kept once
                    seen.add(text)
                    parts[held_out(member.name)].append(text)
    return "\n".join(parts[0]) + "\n", "\n".join(parts[1]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdists", type=Path, help="folder holding the two source releases")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args()
    train, heldout = build(args.sdists)
    changed = []
    for part, text in (("train", train), ("heldout", heldout)):
        path = args.out / f"docs_{part}.txt.xz"
        if args.check:
            if not path.is_file() or lzma.decompress(path.read_bytes()).decode() != text:
                changed.append(path)
            continue
        path.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
        print(f"wrote {path}: {text.count(chr(10))} pages, {len(text.encode()):,} bytes of text")
    if args.check:
        print("unchanged" if not changed else f"would change: {', '.join(map(str, changed))}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
