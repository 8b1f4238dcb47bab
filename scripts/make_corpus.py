"""Rebuild probe/data/corpus/stdlib_docs.txt: English prose from CPython's standard library.

The text is the docstrings (module, class, function, method) of a fixed list of standard-library
modules, read from their source files with `ast` (nothing is imported or run). Each docstring is
cleaned with `inspect.cleandoc` and cut into paragraphs at blank lines; a paragraph is kept when it
reads as prose (see `is_prose`), its wrapped lines are joined with single spaces, and it becomes
one line of the output. Repeated paragraphs are kept once, in first-seen order.

    python3.11 scripts/make_corpus.py            # the stdlib of the running interpreter
    python3.11 scripts/make_corpus.py --check    # exit 1 if the shipped file would change

The shipped file was made with CPython 3.11.7; another version gives slightly different text.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import sysconfig
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "probe" / "data" / "corpus" / "stdlib_docs.txt"

# Source files, relative to the stdlib directory, in the order their paragraphs are written.
MODULES = (
    "abc.py",
    "argparse.py",
    "bisect.py",
    "calendar.py",
    "collections/__init__.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "datetime.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "gettext.py",
    "glob.py",
    "heapq.py",
    "inspect.py",
    "ipaddress.py",
    "json/__init__.py",
    "logging/__init__.py",
    "mailbox.py",
    "optparse.py",
    "pathlib.py",
    "pickle.py",
    "queue.py",
    "random.py",
    "sched.py",
    "secrets.py",
    "shlex.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "subprocess.py",
    "tarfile.py",
    "tempfile.py",
    "textwrap.py",
    "threading.py",
    "typing.py",
    "unittest/case.py",
    "urllib/parse.py",
    "warnings.py",
    "weakref.py",
    "zipfile.py",
)

MIN_WORDS = 12  # shorter paragraphs are mostly signatures, headings or one-line summaries
MAX_SYMBOLS = 0.06  # at most this share of characters outside letters, digits, space, .,;:'"!?()-


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of `source`, in source order.

    Private classes and functions (`_name`, not `__dunder__`) are skipped with everything inside.
    """
    found = []
    named = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef

    def visit(node: ast.AST) -> None:
        if isinstance(node, named) and node.name.startswith("_") and not node.name.endswith("__"):
            return
        if isinstance(node, ast.Module | named):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                found.append(doc)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def paragraphs(doc: str) -> list[str]:
    """Blank-line separated paragraphs of a cleaned docstring, as raw line lists joined by \\n."""
    return [p for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]


def is_prose(paragraph: str) -> bool:
    """Sentences, not code, tables, lists or signatures."""
    lines = paragraph.splitlines()
    if any(line.startswith((" ", "\t")) for line in lines):  # indented: code or a table
        return False
    if any(
        line.lstrip().startswith((">>>", "...", "-", "*", "+", "|", "=", "#")) for line in lines
    ):
        return False
    text = " ".join(line.strip() for line in lines)
    if len(text.split()) < MIN_WORDS or not text[0].isupper() or text[-1] not in ".!?":
        return False
    symbols = sum(1 for c in text if not (c.isalnum() or c.isspace() or c in ".,;:'\"!?()-"))
    return symbols / len(text) <= MAX_SYMBOLS


def build(stdlib: Path) -> str:
    seen: set[str] = set()
    out = []
    for name in MODULES:
        source = (stdlib / name).read_text(encoding="utf-8")
        for doc in docstrings(source):
            for paragraph in paragraphs(doc):
                if not is_prose(paragraph):
                    continue
                line = re.sub(r"\s+", " ", paragraph).strip()
                if line not in seen:
                    seen.add(line)
                    out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args()
    if sys.version_info[:3] != (3, 11, 7):
        print(f"note: the shipped file came from CPython 3.11.7, this is {sys.version.split()[0]}")
    text = build(args.stdlib)
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print("unchanged" if same else f"{args.out} would change")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    n_lines = text.count("\n")
    print(f"wrote {args.out}: {n_lines} paragraphs, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
