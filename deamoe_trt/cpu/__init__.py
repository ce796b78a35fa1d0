"""The fast CPU path: a DeaMoE layer on a small C++ kernel that streams each weight once.

    from deamoe_trt.cpu import CpuDeaMoE
    fast = CpuDeaMoE(layer)          # repacks the weights (fp32 or fp16) once
    y = fast(x)                      # same outputs as layer(x), x: [..., d]

One call per step computes the router logits, routes (the CUDA kernels' routing, deamoeRouting.cuh,
held by tests/cpu to deamoe_trt.routing's decisions; routing="torch" calls
deamoe_trt.routing itself) and runs every used department's shared part once for all its
tokens and every used expert's private part once for its tokens. See deamoe_cpu.cpp for
the design and _build.py for how it is built (at first use, with the system C++ compiler).
"""

from ._build import build, cache_dir, load
from .layer import ROUTINGS, CpuDeaMoE, CpuDeaMoEStack
from .runtime import INT4_MODES, Pool, amx_available, amx_mode, default_threads, int4_mode, pool, simd, stream_read

__all__ = [
    "INT4_MODES",
    "ROUTINGS",
    "CpuDeaMoE",
    "CpuDeaMoEStack",
    "Pool",
    "amx_available",
    "amx_mode",
    "build",
    "cache_dir",
    "default_threads",
    "int4_mode",
    "load",
    "pool",
    "simd",
    "stream_read",
]
