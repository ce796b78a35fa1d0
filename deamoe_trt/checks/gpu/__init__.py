"""GPU check of the DeaMoE CUDA kernels: `deamoe-trt check-gpu` (what it does: the run module)."""

from .cases import shrink
from .run import GpuCheckOptions, run_check

__all__ = ["GpuCheckOptions", "run_check", "shrink"]
