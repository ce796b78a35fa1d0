"""The DeaMoE CUDA kernels' binding (native/cuda/, through ctypes): the library's loading and
build (load_library(): $DEAMOE_TRT_KERNELS_LIB, else a cached build, else a build with CMake +
nvcc for the current GPU), its C ABI, and the calls on a loaded library (forward_with, ...).

The kernels run on tensors through the `cuda` runtime (deamoe_trt.runtimes.cuda), the one
call layer over them:

    from deamoe_trt import runtimes
    y = runtimes.get("cuda").forward(layer, x)    # the whole layer, like layer(x)

Importing this module needs no GPU. The TensorRT plugin does not use this module.
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

__all__ = [
    "ENV_LIBRARY",
    "CudaUnavailableError",
    "KernelBuildError",
    "KernelError",
    "bind",
    "forward_with",
    "kernel_source_dir",
    "load_library",
    "route_with",
    "router_logits_with",
    "source_tree_kernel_dir",
]
