#!/usr/bin/env bash
# Install llama-cpp-python (llama.cpp's Python binding) into the active or ./.venv environment, for
# the GGUF export's llama.cpp tests and benchmark. PyPI ships it as a source release that builds
# llama.cpp with cmake (about 15 minutes on 2 cores); the wheel is cached in
# ${PROBE_WHEELS:-~/.cache/probe/wheels} and reused. A failed build is one line, not an error:
# the tests that need it then skip and say why.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${VIRTUAL_ENV:-$PWD/.venv}/bin/python"
version="${LLAMA_CPP_VERSION:-0.3.36}"
wheels="${PROBE_WHEELS:-$HOME/.cache/probe/wheels}"
mkdir -p "$wheels"
if "$py" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
  exit 0
fi
if ! ls "$wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $version from its source release (cached in $wheels)"
  CMAKE_ARGS="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF ${CMAKE_ARGS:-}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$py" -m pip wheel -q --disable-pip-version-check --no-deps "llama-cpp-python==$version" \
    -w "$wheels" >/dev/null 2>&1 \
    || { echo "llama-cpp-python could not be built: the llama.cpp tests will skip"; exit 0; }
fi
"$py" -m pip install -q --disable-pip-version-check --find-links "$wheels" \
  "llama-cpp-python==$version" \
  || echo "llama-cpp-python could not be installed: the llama.cpp tests will skip"
