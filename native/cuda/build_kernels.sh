#!/usr/bin/env bash
# Builds the DeaMoE kernel library (libdeamoe_kernels.so / .a) for every default
# architecture (86;87;89;90;110 on CUDA 13; Thor as 101 on 12.8/12.9, dropped before) and
# fails if ptxas reports a register spill in any kernel. For CI and releases; the tests
# build one architecture only (tests/native/cuda/test_kernel_library_builds.py).
#
#   native/cuda/build_kernels.sh [BUILD_DIR] [extra cmake -D options...]
#   e.g. native/cuda/build_kernels.sh build/kernels -DCMAKE_CUDA_ARCHITECTURES="87"
#
# Needs nvcc (CUDACXX or PATH, else /usr/local/cuda/bin/nvcc) and CMake >= 3.18; no GPU.
# About 3 minutes on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-${here}/../../build/kernels}"
shift || true

if [[ -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

cmake -S "${here}" -B "${build}" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDEAMOE_PTXAS_VERBOSE=ON "$@"
log="${build}/build_kernels.log"
# pipefail makes the pipeline fail with cmake; the filter alone may find nothing to print.
if ! cmake --build "${build}" --target deamoe_kernels deamoe_kernels_static -j "$(nproc 2>/dev/null || echo 2)" 2>&1 \
  | tee "${log}" | { grep -Ev '^ptxas info|^    [0-9]+ bytes stack frame' || true; }; then
  echo "build_kernels.sh: build failed (log: ${log})" >&2
  exit 1
fi

kernels=$(grep -c "Compiling entry function" "${log}" || true)
spills=$(grep -E "bytes spill" "${log}" | grep -Ev "0 bytes spill stores, 0 bytes spill loads" || true)
if [[ -n "${spills}" ]]; then
  echo "build_kernels.sh: ptxas reports register spills:" >&2
  grep -B2 -E "[1-9][0-9]* bytes spill" "${log}" >&2
  exit 1
fi
echo "build_kernels.sh: ${kernels} kernel compilations, no spills; libraries in ${build}"
