"""GPU check of the DeaMoE CUDA kernels: correctness against the PyTorch reference, then speed.

    deamoe-trt check-gpu --out DIR        (or: python -m deamoe_trt.checks.gpu --out DIR)

On any CUDA machine with PyTorch. It
1. builds the kernels for the local GPU only (CMake + nvcc, cached in ~/.cache/deamoe_trt);
2. measures the device copy bandwidth (a 1 GiB device-to-device copy; bytes read + written)
   and a read-only bandwidth;
3. checks, per preset and dtype, the kernels' routing (exact ids vs the reference; any
   difference must be a near-tie of the scores) and outputs (float32: allclose; fp16/bf16:
   relative error against float32 math on the same weights, from the kernels' routing);
   The int4/int8 rows (--bits) do the same for layer.quantized(QuantConfig(bits, G)) (the
   largest group size dividing every width) against the PyTorch reference running the
   dequantized weights;
4. times DeaMoE forward at 1/2/4/8/16 tokens: the kernels, the same kernels on
   layer.expanded() (f_s = 0, f_p = f_s + f_p; for int4/int8 the quantized twin, same codes)
   and the PyTorch reference, with CUDA events,
   warm-up, a fresh pre-generated input per iteration and the L2 flushed (read of a 1 GiB
   buffer) before each; eager launches and CUDA-graph replay; programmatic dependent launch
   off and on. Reports bytes loaded per step (deamoe_trt.traffic.weights_loaded on the
   kernels' routing of that input), achieved bandwidth, its fraction of the copy bandwidth
   and the speedups; per kernel (torch.profiler, 1 token), its time, its bytes
   (deamoe_trt.perf_model's per-kernel account of the same routing), its bandwidth and the
   model's predicted time for this GPU;
5. writes DIR/gpu_check.json (everything) and DIR/gpu_check.txt (the tables), prints them.
Exit status 0 when every correctness check passed (performance targets are reported, not
enforced), 1 otherwise. Designed to finish in under 5 minutes on an H200 (--budget-s).

--dry-run runs the same flow on the CPU through the SIMT-emulated kernel library
(deamoe_trt.checks.emulated; needs a source checkout) with shrunken presets: a check of
this script, not of the GPU.

Modules: cli (arguments and the run's order), cases (the layers checked), correctness,
timing (bandwidth, benchmarks, per-kernel profile) and report (the tables and targets).
The kernels are reached through deamoe_trt.runtimes.cuda.
"""

from .cases import shrink
from .cli import main, parse_args

__all__ = ["main", "parse_args", "shrink"]
