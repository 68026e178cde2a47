#!/usr/bin/env bash
# Builds bench/llm.py's peer, llama.cpp through llama-cpp-python, outside the repository:
#
#     bench/setup_llama_cpp.sh            # ~20 minutes on 2 shared cores, once
#
# Into $FERRY_LLAMA_CPP_DIR (default ~/.cache/ferry/bench/llama-cpp-python):
#   src/    the unpacked llama-cpp-python sdist: its vendored llama.cpp carries
#           convert_hf_to_gguf.py and gguf-py, which bench/llm.py runs (a patched copy);
#   build/  llama.cpp's libraries (libllama, libggml*) built by the sdist's own CMakeLists with
#           the CPU's native instructions (GGML_NATIVE: AVX2/FMA/F16C here), Release, as a
#           `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python` builds them;
#   venv/   a virtualenv with the sdist's Python package, its lib/ holding those libraries.
# Only the libraries the Python package loads are compiled: pip's build of the sdist also
# compiles llama.cpp's `common` and multimodal `mtmd` libraries (about 100 of its 178 objects,
# an extra ~40 minutes here) that the bench never loads.
# Idempotent: a finished setup (venv/.built) is kept.  LLAMA_CPP_PYTHON_VERSION pins a version.
set -euo pipefail

DIR="${FERRY_LLAMA_CPP_DIR:-$HOME/.cache/ferry/bench/llama-cpp-python}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-}"
PYTHON="${PYTHON:-python3}"
SPEC="llama-cpp-python${VERSION:+==$VERSION}"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

if [[ -f "$DIR/venv/.built" ]]; then
    echo "llama-cpp-python already built in $DIR"
    exit 0
fi
mkdir -p "$DIR/sdist" "$DIR/src"
[[ -x "$DIR/venv/bin/python" ]] || "$PYTHON" -m venv "$DIR/venv"
"$DIR/venv/bin/pip" install --quiet --upgrade pip
# The sdist itself (kept: its vendored llama.cpp carries the GGUF converter).
"$DIR/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python -d "$DIR/sdist" "$SPEC"
SDIST="$(ls -t "$DIR"/sdist/llama_cpp_python-*.tar.gz | head -n1)"
[[ -f "$DIR/src/CMakeLists.txt" ]] || tar -xzf "$SDIST" -C "$DIR/src" --strip-components=1

# llama.cpp's libraries: native instructions, two jobs, low priority (the host is shared).
# A CPU may list AMX while its kernel (a VM's) grants no tile data (XTILEDATA, bit 18 of what
# arch_prctl(ARCH_GET_XCOMP_SUPP) reports): -march=native would then compile ggml's AMX
# kernels, which die on their first tile instruction (SIGILL), so they are left out there.
NATIVE_FLAGS=""
if grep -qw amx_int8 /proc/cpuinfo && ! "$PYTHON" -c '
import ctypes, sys
bits = ctypes.c_uint64(0)
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.syscall(158, 0x1022, ctypes.byref(bits)) == 0 and bits.value >> 18 & 1 else 1)'; then
    NATIVE_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    echo "AMX listed but not granted by the kernel: building without it"
fi
cmake -S "$DIR/src" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS="$NATIVE_FLAGS" -DCMAKE_CXX_FLAGS="$NATIVE_FLAGS" ${CMAKE_ARGS:-}
nice -n 15 cmake --build "$DIR/build" --parallel "$JOBS" --target llama ggml

# The Python package without a second compile, then the libraries where it looks for them.
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$DIR/venv/bin/pip" install --quiet "$SDIST"
LIB="$("$DIR/venv/bin/python" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')"
mkdir -p "$LIB"
find "$DIR/build" -name 'lib*.so*' -exec cp -P {} "$LIB/" \;
"$DIR/venv/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())"
touch "$DIR/venv/.built"
echo "built llama-cpp-python into $DIR"
