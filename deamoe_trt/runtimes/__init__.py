"""The runtimes that run deamoe-trt's layers and models, behind one interface (`base.Runtime`).

    from deamoe_trt import runtimes
    runtimes.names()                     # ('torch', 'cpu', 'cuda', 'cuda-emulated', 'ort', 'tensorrt')
    rt = runtimes.get("cpu")
    reason = rt.available()              # None, or one line saying what is missing here
    fast = rt.prepare(layer, threads=4)  # a base.Prepared: fast(x) is like layer(x)

One module per runtime (torch.py, cpu_kernel.py, cuda.py, onnxruntime.py, tensorrt.py),
each importing its engine lazily, so that every runtime can be listed, and asked why it
cannot run, on any machine. Adding a runtime is one new module with a `RUNTIME` object and
one line in `_MODULES`.

Subpackages hold engines that serve whole models on their own terms (vllm/).
"""

from __future__ import annotations

import importlib

from ..errors import UsageError
from .base import Prepared, Runtime

__all__ = ["Prepared", "Runtime", "get", "names"]

# name -> module (in this package) whose RUNTIME implements it; the order is the one listings use.
_MODULES = {
    "torch": "torch",
    "cpu": "cpu_kernel",
    "cuda": "cuda",
    "cuda-emulated": "cuda_emulated",
    "ort": "onnxruntime",
    "tensorrt": "tensorrt",
}


def names() -> tuple[str, ...]:
    """Every runtime's name, available here or not."""
    return tuple(_MODULES)


def get(name: str) -> Runtime:
    """The runtime called name; a one-line UsageError for an unknown name."""
    module = _MODULES.get(name)
    if module is None:
        raise UsageError(f"unknown runtime {name!r}; choose one of: {', '.join(_MODULES)}")
    runtime: Runtime = importlib.import_module(f"{__name__}.{module}").RUNTIME
    return runtime
