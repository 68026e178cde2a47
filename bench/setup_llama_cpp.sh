#!/usr/bin/env bash
# Builds bench/llm.py's peer, llama.cpp through llama-cpp-python, outside the repository:
#
#     bench/setup_llama_cpp.sh            # ~10-20 minutes on 2 cores, once
#
# Into $FERRY_LLAMA_CPP_DIR (default ~/.cache/ferry/bench/llama-cpp-python):
#   venv/      its own virtualenv with llama-cpp-python built from the sdist with the CPU's native
#              instructions (GGML_NATIVE: AVX2/FMA/F16C here), as its users build it;
#   src/       the unpacked sdist: vendor/llama.cpp/convert_hf_to_gguf.py and gguf-py, which
#              bench/llm.py runs (from a patched copy) to make the GGUF beside Ferry's package.
# Idempotent: a finished build (venv/.built) is kept.  LLAMA_CPP_PYTHON_VERSION pins a version.
set -euo pipefail

DIR="${FERRY_LLAMA_CPP_DIR:-$HOME/.cache/ferry/bench/llama-cpp-python}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-}"
PYTHON="${PYTHON:-python3}"
SPEC="llama-cpp-python${VERSION:+==$VERSION}"

if [[ -f "$DIR/venv/.built" ]]; then
    echo "llama-cpp-python already built in $DIR"
    exit 0
fi
mkdir -p "$DIR/sdist" "$DIR/src"
"$PYTHON" -m venv "$DIR/venv"
"$DIR/venv/bin/pip" install --quiet --upgrade pip
# The sdist itself (kept: its vendored llama.cpp carries the GGUF converter).
"$DIR/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python -d "$DIR/sdist" "$SPEC"
SDIST="$(ls -t "$DIR"/sdist/llama_cpp_python-*.tar.gz | head -n1)"
tar -xzf "$SDIST" -C "$DIR/src" --strip-components=1
# Native instructions, two build jobs, at low priority: the host is shared.
export CMAKE_ARGS="-DGGML_NATIVE=ON ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
nice -n 15 "$DIR/venv/bin/pip" install --verbose --no-cache-dir "$SDIST"
# gguf-py's own dependencies, for the conversion script run from the bench's interpreter path.
"$DIR/venv/bin/pip" install --quiet numpy sentencepiece pyyaml tqdm
"$DIR/venv/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
touch "$DIR/venv/.built"
echo "built llama-cpp-python into $DIR"
