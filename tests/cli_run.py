"""Run the `probe` entry point in-process, as a shell would, and get its exit status; or in a
fresh interpreter, to see what it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from probe_cli.main import main

HEAVY = ("torch", "pandas", "matplotlib", "scipy", "numpy", "safetensors", "tokenizers")
_FRESH = """
import json, sys
from probe_cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


def exit_code(args: list[str]) -> int:
    """The exit status of `probe ARGS...` (0 when it returns without raising SystemExit)."""
    try:
        main(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        return 1  # sys.exit("message")
    return 0


@dataclass
class Fresh:
    """What `probe ARGS` did in a fresh interpreter."""

    code: int  # its exit status
    heavy: list[str]  # the modules of HEAVY it imported
    said: list[str]  # the lines it wrote on stderr
    out: str  # its stdout


def in_fresh_interpreter(args: list[str], cwd: Path | None = None) -> Fresh:
    """`probe ARGS` in a new Python process."""
    done = subprocess.run([sys.executable, "-c", _FRESH.format(heavy=HEAVY), *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          check=False)  # fmt: skip
    *said, last = [line for line in done.stderr.splitlines() if line.strip()]
    result = json.loads(last)
    return Fresh(result["code"], result["heavy"], said, done.stdout)
