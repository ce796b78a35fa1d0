#!/usr/bin/env bash
# On a CUDA machine with PyTorch, from a source checkout (nothing installed): the kernels'
# check (`deamoe-trt check-gpu`, with --tune: this GPU's kernel variant table, OUT/<GPU name>.json) and the
# tests marked gpu, logs and gpu_check.{json,txt} in OUT.
#
#   scripts/device_check.sh OUT [check-gpu arguments, default --bits 0,4,8 --tune --sm-limit 16]
#
# A kernel library named by DEAMOE_TRT_KERNELS_LIB is used when it loads (build it elsewhere with
# native/cuda/build_kernels.sh for the GPU's architecture); otherwise check-gpu builds one.
set -uo pipefail
out=${1:?usage: scripts/device_check.sh OUT [check-gpu arguments]}
shift
[ $# -gt 0 ] || set -- --bits 0,4,8 --tune --sm-limit 16
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
if [ -n "${DEAMOE_TRT_KERNELS_LIB:-}" ] &&
    ! "$python" -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$DEAMOE_TRT_KERNELS_LIB" 2>>"$out/gpu.txt"; then
    echo "device_check: $DEAMOE_TRT_KERNELS_LIB does not load here; building the kernels" | tee -a "$out/gpu.txt"
    unset DEAMOE_TRT_KERNELS_LIB
fi

"$python" -m deamoe_trt check-gpu --out "$out" "$@" 2>&1 | tee "$out/check_gpu.log"
check=${PIPESTATUS[0]}
"$python" -m pytest -m gpu -q -p no:cacheprovider -rs tests/runtimes/test_cuda.py tests/cuda/test_cuda_binding.py \
    2>&1 | tee "$out/pytest_gpu.log" | tail -25
tests=${PIPESTATUS[0]}
"$python" scripts/device_lm_check.py --out "$out" 2>&1 | tee "$out/lm_check.log" | tail -30  # whole-model table
echo "device_check: check-gpu exit $check, gpu tests exit $tests"
[ "$check" -eq 0 ] && [ "$tests" -eq 0 ]
