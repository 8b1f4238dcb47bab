#!/usr/bin/env bash
# Set up probe in a virtual environment: ./.venv, or the one already active ($VIRTUAL_ENV).
# torch is installed only when the environment has none, so a GPU user's own build is kept;
# PROBE_TORCH chooses what to install then (default: torch==2.13.0, the CPU build on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${VIRTUAL_ENV:-}" ]; then
  py="$VIRTUAL_ENV/bin/python"
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  py=.venv/bin/python
fi
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check "${PROBE_TORCH:-torch==2.13.0}"
fi
"$py" -m pip install -q --disable-pip-version-check -e ".[dev]"
echo "probe is set up in $("$py" -c 'import sys; print(sys.prefix)')"
