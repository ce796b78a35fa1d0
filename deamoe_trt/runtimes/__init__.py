"""The runtimes that run deamoe-trt's layers and models, behind one interface (`base.Runtime`).

    from deamoe_trt import runtimes
    runtimes.names()                     # ('torch', 'cpu', 'cuda', 'cuda-emulated', 'ort', 'tensorrt')
    runtimes.names(can="batched")        # ('cpu', 'cuda', 'cuda-emulated'): from each one's Capabilities
    rt = runtimes.get("cpu")
    reason = rt.available()              # None, or one line saying what is missing here
    fast = rt.prepare(layer, threads=4)  # a base.Prepared: fast(x) is like layer(x)

One module per runtime (torch.py, cpu_kernel.py, cuda.py, onnxruntime.py, tensorrt.py),
each importing its engine lazily, so that every runtime can be listed, and asked why it
cannot run, on any machine. Adding a runtime is one new module with a `RUNTIME` object and
one line in `_MODULES`. Commands take their lists of runtimes from `names` (each runtime's
`capabilities` says what it can do), so a new runtime appears in every command that fits it.

Engines that serve whole models on their own terms are in deamoe_trt.integrations (vllm/).
"""

from __future__ import annotations

import importlib

from ..errors import UsageError
from .base import Ability, Capabilities, Prepared, Runtime

__all__ = ["Capabilities", "Prepared", "Runtime", "get", "names"]

# name -> module (in this package) whose RUNTIME implements it; the order is the one listings use.
_MODULES = {
    "torch": "torch",
    "cpu": "cpu_kernel",
    "cuda": "cuda",
    "cuda-emulated": "cuda_emulated",
    "ort": "onnxruntime",
    "tensorrt": "tensorrt",
}


# Older names still accepted (a Triton model repository written with runtime "trt" keeps loading).
ALIASES = {"trt": "tensorrt"}


def names(
    can: Ability | None = None,
    *,
    gpu: bool | None = None,
    reference: bool | None = None,
    emulated: bool | None = None,
) -> tuple[str, ...]:
    """Runtimes' names in the registry's order, available here or not: every one, or those
    that can do what can names ("layers", "decoding", "batched"); gpu, reference and emulated,
    when given, keep those whose capabilities say so (gpu: needs a GPU)."""
    chosen = []
    for name in _MODULES:
        c = get(name).capabilities
        if (
            (can is None or c.can(can))
            and (gpu is None or ("gpu" in c.needs) == gpu)
            and (reference is None or c.reference == reference)
            and (emulated is None or c.emulated == emulated)
        ):
            chosen.append(name)
    return tuple(chosen)


def get(name: str) -> Runtime:
    """The runtime called name (or an older alias of it); a one-line UsageError for an unknown name."""
    module = _MODULES.get(ALIASES.get(name, name))
    if module is None:
        raise UsageError(f"unknown runtime {name!r}; choose one of: {', '.join(_MODULES)}")
    runtime: Runtime = importlib.import_module(f"{__name__}.{module}").RUNTIME
    return runtime
