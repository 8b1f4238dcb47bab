"""The shape of the house (docs/architecture.md): no file of probe/ or cli/ past 400 lines, no
import circle among their modules, and nothing a command reads for its help or its early checks
(the registries of methods) that loads torch.

The import graph is read from the source (every `import` and `from ... import`, at module level
or inside a function, TYPE_CHECKING blocks included: a circle a lazy import hides is still a
circle), independently of the code that runs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"probe": ROOT / "probe", "probe_cli": ROOT / "cli"}
MOST_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `module` imports (a `from package import name` imports the
    submodule `package.name` where there is one, else the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    out.discard(module)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_no_file_of_probe_or_cli_is_past_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MOST_LINES}  # fmt: skip
    assert not long, f"past {MOST_LINES} lines (two concepts: split it): {long}"


def test_no_import_circle():
    known = _modules()
    graph = {m: _imports(m, p, known) for m, p in known.items()}
    assert not _circles(graph)


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def test_a_relative_and_a_submodule_import_are_edges(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom pkg.c import thing\n")
    known = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py",
             "pkg.c": pkg / "c.py"}  # fmt: skip
    assert _imports("pkg.a", pkg / "a.py", known) == {"pkg.b", "pkg.c"}


@pytest.mark.parametrize("registry", [
    "probe.pruning.estimators:ESTIMATORS",
    "probe.kv.methods:METHODS",
    "probe.study.heads.steps:KINDS",
])  # fmt: skip
def test_a_registry_reads_its_declarations_without_torch(registry):
    module, name = registry.split(":")
    code = (f"import sys; from {module} import {name}; {name}.names(); "
            "assert 'torch' not in sys.modules, 'torch was imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)


def copy_pairs(folder: Path, run: int = 6) -> list[tuple[str, str]]:
    """The pairs of places in `folder`'s Python files that share `run` or more consecutive lines
    alike, one pair per two regions however long their shared run. Lines are compared stripped;
    blank lines, comments, imports and lines of at most 3 characters (`)`, `],`) are left out.
    A cruder measure than a clone detector (which also pairs runs of the same shape under
    other names), and an independent one."""
    lines: list[tuple[str, int, str]] = []  # (file, line number, text)
    for path in sorted(folder.rglob("*.py")):
        name = str(path.relative_to(folder))
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = text.strip()
            skip = text.startswith(("#", "from ", "import ", "if TYPE_CHECKING"))
            if len(text) > 3 and not skip:
                lines.append((name, number, text))
    first: dict[tuple[str, ...], tuple[str, int]] = {}
    pairs: dict[tuple[str, str], int] = {}  # (place a, place b) -> last line of b seen
    for i in range(len(lines) - run + 1):
        window = lines[i : i + run]
        if len({f for f, _, _ in window}) > 1:
            continue  # a run crossing files
        key = tuple(t for _, _, t in window)
        here = (window[0][0], window[0][1])
        if key not in first:
            first[key] = here
            continue
        there = first[key]
        if there[0] == here[0] and abs(there[1] - here[1]) < run:
            continue  # a run overlapping itself (repeated lines)
        pair = (f"{there[0]}", f"{here[0]}:{here[1]}")
        joined = [p for p in pairs if p[0] == pair[0] and p[1].split(":")[0] == here[0]
                  and here[1] - pairs[p] <= run]  # fmt: skip
        if joined:  # the same shared run, one line on
            pairs[joined[0]] = here[1]
        else:
            pairs[pair] = here[1]
    return sorted(pairs)


def test_the_copy_finder_finds_a_copied_run(tmp_path):
    body = "\n".join(f"    value_{i} = compute({i}, name='x')" for i in range(8))
    (tmp_path / "a.py").write_text(f"def f():\n{body}\n")
    (tmp_path / "b.py").write_text(f"def g():\n    other = 1\n{body}\n")
    (tmp_path / "c.py").write_text("def h():\n    return 2\n")
    assert copy_pairs(tmp_path) == [("a.py", "b.py:3")]


def test_probe_repeats_itself_in_few_places():
    # 8 pairs before issue 39 made methods and families declare themselves, 2 after
    pairs = copy_pairs(PACKAGES["probe"])
    assert len(pairs) <= 4, pairs
