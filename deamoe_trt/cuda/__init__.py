"""The DeaMoE CUDA kernels (native/cuda/) on PyTorch CUDA tensors, through ctypes.

    from deamoe_trt import cuda
    y = cuda.forward(layer, x)          # the whole layer, like layer(x)
    r = cuda.route(layer, x)            # a deamoe_trt.routing.Routing
    z = cuda.router_logits(layer, x)    # [T, N] float32

The first call loads libdeamoe_kernels.so (load_library(): $DEAMOE_TRT_KERNELS_LIB, else a
cached build, else a build with CMake + nvcc for the current GPU). Calls run on PyTorch's
current stream and do not synchronise. Importing this module needs no GPU; calling it does
(CudaUnavailableError otherwise). The TensorRT plugin does not use this module.
"""

from ._abi import bind
from ._library import (
    ENV_LIBRARY,
    CudaUnavailableError,
    KernelBuildError,
    kernel_source_dir,
    load_library,
    source_tree_kernel_dir,
)
from ._ops import KernelError, forward_with, route_with, router_logits_with
from .device_calls import forward, route, route_logits, router_logits, set_programmatic_launch, workspace_size

__all__ = [
    "ENV_LIBRARY",
    "CudaUnavailableError",
    "KernelBuildError",
    "KernelError",
    "bind",
    "forward",
    "forward_with",
    "kernel_source_dir",
    "load_library",
    "route",
    "route_logits",
    "route_with",
    "router_logits",
    "router_logits_with",
    "set_programmatic_launch",
    "source_tree_kernel_dir",
    "workspace_size",
]
