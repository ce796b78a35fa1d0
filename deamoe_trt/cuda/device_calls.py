"""The kernels on PyTorch CUDA tensors: each call checks that a GPU is there and that its tensors
share one, then runs on that device's current stream (no synchronisation)."""

from __future__ import annotations

import ctypes

import torch

from ..config import DeaMoEConfig
from ..errors import UsageError
from ..layer import DeaMoELayer
from ..routing import Routing
from . import _ops
from ._library import CudaUnavailableError, load_library


def _require_cuda(*tensors: torch.Tensor | None) -> torch.device:
    if not torch.cuda.is_available():
        raise CudaUnavailableError("deamoe_trt.cuda needs a CUDA GPU: torch.cuda.is_available() is False")
    devices = {t.device for t in tensors if t is not None}
    for device in devices:
        if device.type != "cuda":
            raise UsageError(f"deamoe_trt.cuda works on CUDA tensors; got a tensor on {device}")
    if len(devices) > 1:
        raise UsageError(f"all tensors must be on one GPU; got {', '.join(sorted(map(str, devices)))}")
    return devices.pop() if devices else torch.device("cuda", torch.cuda.current_device())


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _kernels() -> ctypes.CDLL:
    return load_library()


def forward(layer: DeaMoELayer, hidden_states: torch.Tensor, *, variant: int | str | None = None) -> torch.Tensor:
    """The layer's output for hidden_states [..., d] through the kernels (same shape and dtype).

    Computed in the layer's dtype with float32 accumulation; hidden_states of another
    dtype are cast to it first and the result cast back. A quantized layer (layer.quant)
    runs from its packed int4/int8 codes and scales, dequantized in registers.
    variant: a kernel variant's name or id (native/cuda/KERNELS.md, "Variants"); None runs
    the one this GPU's table (deamoe_trt.cuda.tuning) lists for the case, else the default.
    """
    device = _require_cuda(hidden_states, layer.router.weight)
    lib = _kernels()
    with torch.cuda.device(device):
        return _ops.forward_with(lib, layer, hidden_states, _stream(device), variant=variant)


def route(layer: DeaMoELayer, hidden_states: torch.Tensor) -> Routing:
    """The kernels' routing decisions for hidden_states [..., d], as a deamoe_trt.routing.Routing.

    expert_ids, weights, department_ids and kept_departments come from the routing kernel;
    scores is softmax/sigmoid (PyTorch) of the kernels' router logits.
    """
    device = _require_cuda(hidden_states, layer.router.weight)
    lib = _kernels()
    with torch.cuda.device(device):
        return _ops.route_with(lib, layer, hidden_states, _stream(device))


def router_logits(layer: DeaMoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
    """[T, N] float32 router logits z = x Wr^T (+ the layer's router.logit_bias) as the kernels compute them."""
    device = _require_cuda(hidden_states, layer.router.weight)
    lib = _kernels()
    with torch.cuda.device(device):
        return _ops.router_logits_with(lib, layer, hidden_states, _stream(device))


def route_logits(config: DeaMoEConfig, logits: torch.Tensor, router_bias: torch.Tensor | None = None) -> Routing:
    """The routing kernel (spec steps 1-5) on given logits [T, N]: the device twin of
    deamoe_trt.routing.route_logits."""
    device = _require_cuda(logits, router_bias)
    lib = _kernels()
    with torch.cuda.device(device):
        return _ops.route_logits_with(lib, config, logits, router_bias, _stream(device))


def set_programmatic_launch(enabled: bool) -> bool:
    """Launch the forward kernels as programmatic dependents (sm_90+; ignored before).

    Hides the gaps between the forward's kernels; results are identical either way.
    Process-wide, on by default (off when DEAMOE_PROGRAMMATIC_LAUNCH=0 at load).
    Returns the previous setting.
    """
    lib = _kernels()
    previous = bool(lib.deamoe_programmatic_launch())
    lib.deamoe_set_programmatic_launch(int(bool(enabled)))
    return previous


def workspace_size(config: DeaMoEConfig, max_tokens: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of scratch GPU memory one forward over up to max_tokens tokens needs."""
    return _ops.workspace_bytes(_kernels(), config, max_tokens, dtype)
