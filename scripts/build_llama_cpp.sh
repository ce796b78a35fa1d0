#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-batched-bench, llama-quantize and llama-perplexity, the
# CPU contender that `deamoe-trt bench-lm --llama-bench DIR/build/bin/llama-bench` times
# against our runtimes (llama-batched-bench with --sequences).
#   scripts/build_llama_cpp.sh [DIR]     (default build/llama.cpp; DIR is made if missing)
# The source is the llama.cpp vendored in PyPI's llama-cpp-python sdist, pinned so that a
# benchmark names the exact llama.cpp it ran; pip fetches it, so no other registry is needed.
# Idempotent: a rerun reuses the download, the unpacked tree and the CMake build directory.
# The tests that need the binaries find them through DEAMOE_LLAMA_CPP_BIN=DIR/build/bin.
set -euo pipefail
version=0.3.36
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/llama.cpp}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)
sdist=$dir/llama_cpp_python-$version.tar.gz
src=$dir/llama_cpp_python-$version/vendor/llama.cpp
if [[ ! -f $sdist ]]; then
    "$python" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
        -d "$dir" "llama-cpp-python==$version"
fi
if [[ ! -f $src/CMakeLists.txt ]]; then
    tar -xzf "$sdist" -C "$dir"
fi
cd "$src"
# Without AMX: hosts that advertise AMX tiles but fault on them (SIGILL in ggml's AMX kernels
# for Q8_0/Q4_0, as on the VMs this project benchmarks on) would crash llama.cpp; ggml then
# takes its AVX-512/AVX2 repacked kernels. LLAMA_CPP_AMX=1 keeps AMX where it works.
flags=""
[[ ${LLAMA_CPP_AMX:-0} == 1 ]] || flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
[[ $(uname -m) == x86_64 ]] || flags=""
cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags"
cmake --build build -j"${JOBS:-2}" --target llama-bench llama-batched-bench llama-quantize llama-perplexity
echo "llama.cpp binaries: $src/build/bin"
