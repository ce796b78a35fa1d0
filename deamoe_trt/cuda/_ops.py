"""Calls into a loaded kernel library on PyTorch tensors.

Device-agnostic on purpose: the public functions in deamoe_trt.cuda pass CUDA tensors and
the current stream; the tests pass CPU tensors to the SIMT-emulated build of the same
library (tests/native/cuda/, check-gpu --dry-run), which runs the kernel code on the host.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from ..config import DeaMoEConfig
from ..dtypes import BY_TORCH
from ..errors import DeaMoEError, UsageError
from ..layer import SUPPORTED_DTYPES, DeaMoELayer
from ..quant import QuantizedWeight
from ..routing import Routing
from . import tuning
from ._abi import DTYPES, STATUS_NAMES, SUCCESS, LayerWeights, layer_params, variant_names


class KernelError(DeaMoEError):
    """A DeaMoE kernel call returned an error status (the message has the library's reason)."""


def check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status == SUCCESS:
        return
    reason = (lib.deamoe_last_error() or b"").decode(errors="replace")
    name = STATUS_NAMES.get(status, f"status {status}")
    raise KernelError(f"{call} failed: {name}" + (f": {reason}" if reason else ""))


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _weight(tensor: torch.Tensor | None) -> torch.Tensor | None:
    if tensor is None:
        return None
    return tensor.detach().contiguous()


def _tokens(config: DeaMoEConfig, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    d = config.hidden_size
    if x.dim() < 1 or x.shape[-1] != d:
        raise UsageError(f"hidden_states must have shape [..., {d}], got {list(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise UsageError(f"hidden_states must be float32, float16 or bfloat16, got {x.dtype}")
    return x.reshape(-1, d).to(dtype).contiguous()


def _layer_dtype(layer: DeaMoELayer) -> torch.dtype:
    dtype = layer.dtype
    if dtype not in DTYPES:
        raise UsageError(f"the layer's dtype must be float32, float16 or bfloat16, got {dtype}")
    return dtype


def layer_weights(layer: DeaMoELayer) -> tuple[LayerWeights, list[torch.Tensor]]:
    """LayerWeights pointing at layer's tensors (made contiguous), and the tensors to keep alive.

    A quantized layer's FFN weights are passed as their packed codes (qweight bytes) with
    their scales in the `...Scales` members (docs/quantization.md's format, as stored); the
    biases (never quantized) as they are."""
    keep: list[torch.Tensor] = []

    def take(tensor: torch.Tensor | None) -> int | None:
        tensor = _weight(tensor)
        if tensor is not None:
            keep.append(tensor)
        return _ptr(tensor)

    fields: dict[str, int | None] = {
        "routerWeight": take(layer.router.weight),
        "routerBias": take(layer.router.bias),
        "routerLogitBias": take(layer.router.logit_bias),
        "sharedGate": take(layer.shared_experts.gate if layer.shared_experts is not None else None),
    }
    ffn = {"department": layer.departments, "expert": layer.experts, "shared": layer.shared_experts}
    for prefix, part in ffn.items():
        for name, field in (("gate_up", "GateUp"), ("down", "Down")):
            weight = getattr(part, name) if part is not None else None
            if isinstance(weight, QuantizedWeight):
                fields[prefix + field] = take(weight.qweight)
                fields[prefix + field + "Scales"] = take(weight.scales)
            else:
                fields[prefix + field] = take(weight)
        for name, field in (("gate_up_bias", "GateUpBias"), ("down_bias", "DownBias")):
            fields[prefix + field] = take(getattr(part, name, None) if part is not None else None)
    fields.pop("departmentDownBias")  # departments have no down bias
    return LayerWeights(**fields), keep


def workspace_bytes(lib: ctypes.CDLL, config: DeaMoEConfig, max_tokens: int, dtype: torch.dtype) -> int:
    params = layer_params(config)
    size = lib.deamoe_workspace_size(ctypes.byref(params), max_tokens, DTYPES[dtype])
    if size == 0:
        check(lib, lib.deamoe_validate(ctypes.byref(params)), "deamoe_workspace_size")
    return int(size)


@functools.lru_cache(maxsize=16)
def _cuda_device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _device_name(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None  # the SIMT-emulated library on host tensors: no GPU, no table
    return _cuda_device_name(device.index if device.index is not None else torch.cuda.current_device())


def variant_id(lib: ctypes.CDLL, layer: DeaMoELayer, num_tokens: int, device: torch.device,
               variant: int | str | None) -> int:  # fmt: skip
    """The kernel variant a forward runs: `variant` (an id or a name of this library's), or for
    None the per-GPU table's choice for this layer and token count (deamoe_trt.cuda.tuning; 0,
    the default kernels, on a GPU without a table, and on the emulated library)."""
    names = variant_names(lib)
    if variant is None:
        bits = layer.quant.bits if layer.quant is not None else 0
        name = tuning.select(_device_name(device), layer.config, BY_TORCH[layer.dtype].name, bits, num_tokens)
        # A table written by a library with other variants: what this one lacks runs the default.
        return names.index(name) if name in names else 0
    if isinstance(variant, str):
        if variant not in names:
            raise UsageError(f"unknown kernel variant {variant!r}; this library has: {', '.join(names)}")
        return names.index(variant)
    if not 0 <= int(variant) < len(names):
        raise UsageError(f"kernel variant must be 0..{len(names) - 1}, got {variant}")
    return int(variant)


def forward_with(lib: ctypes.CDLL, layer: DeaMoELayer, x: torch.Tensor, stream: int | None = None,
                 variant: int | str | None = None) -> torch.Tensor:  # fmt: skip
    """The layer's output for x ([..., d]), in x's dtype (computed in the layer's dtype).

    variant: the kernel variant (variant_id); None: this GPU's table's choice."""
    dtype = _layer_dtype(layer)
    config = layer.config
    tokens = _tokens(config, x, dtype)
    num_tokens = tokens.shape[0]
    out = torch.empty_like(tokens)
    if num_tokens:
        chosen = variant_id(lib, layer, num_tokens, tokens.device, variant)
        params = layer_params(config, layer.router_dtype == torch.float32, layer.quant)
        weights, keep = layer_weights(layer)
        size = workspace_bytes(lib, config, num_tokens, dtype)
        workspace = torch.empty(size, dtype=torch.uint8, device=tokens.device)
        status = lib.deamoe_forward_variant(
            ctypes.byref(params),
            ctypes.byref(weights),
            DTYPES[dtype],
            chosen,
            _ptr(tokens),
            _ptr(out),
            num_tokens,
            _ptr(workspace),
            size,
            stream,
        )
        check(lib, status, "deamoe_forward_variant")
        del keep
    return out.to(x.dtype).reshape(x.shape)


def router_logits_with(
    lib: ctypes.CDLL, layer: DeaMoELayer, x: torch.Tensor, stream: int | None = None
) -> torch.Tensor:
    """[T, N] float32 router logits, as the kernels compute them."""
    dtype = _layer_dtype(layer)
    config = layer.config
    tokens = _tokens(config, x, dtype)
    logits = torch.empty(tokens.shape[0], config.num_experts, dtype=torch.float32, device=tokens.device)
    if tokens.shape[0]:
        params = layer_params(config, layer.router_dtype == torch.float32)
        router = _weight(layer.router.weight)
        logit_bias = _weight(layer.router.logit_bias)
        status = lib.deamoe_router_logits(
            ctypes.byref(params),
            DTYPES[dtype],
            _ptr(tokens),
            _ptr(router),
            _ptr(logit_bias),
            tokens.shape[0],
            _ptr(logits),
            stream,
        )
        check(lib, status, "deamoe_router_logits")
    return logits


def _routing_outputs(config: DeaMoEConfig, num_tokens: int, device: torch.device) -> list[torch.Tensor]:
    k, g = config.top_k, config.top_departments
    return [
        torch.empty(num_tokens, k, dtype=torch.int32, device=device),
        torch.empty(num_tokens, k, dtype=torch.float32, device=device),
        torch.empty(num_tokens, k, dtype=torch.int32, device=device),
        torch.empty(num_tokens, g, dtype=torch.int32, device=device),
    ]


def _scores(config: DeaMoEConfig, logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1) if config.score_func == "softmax" else torch.sigmoid(logits)


def _routing(config: DeaMoEConfig, outputs: list[torch.Tensor], logits: torch.Tensor) -> Routing:
    ids, weights, departments, kept = outputs
    return Routing(
        expert_ids=ids.long(),
        weights=weights,
        department_ids=departments.long(),
        kept_departments=kept.long(),
        scores=_scores(config, logits),
    )


def route_with(lib: ctypes.CDLL, layer: DeaMoELayer, x: torch.Tensor, stream: int | None = None) -> Routing:
    """The kernels' routing of x (deamoe_route); scores are softmax/sigmoid of the kernels' logits."""
    dtype = _layer_dtype(layer)
    config = layer.config
    tokens = _tokens(config, x, dtype)
    num_tokens = tokens.shape[0]
    outputs = _routing_outputs(config, num_tokens, tokens.device)
    if num_tokens:
        params = layer_params(config, layer.router_dtype == torch.float32)
        router = _weight(layer.router.weight)
        bias = _weight(layer.router.bias)
        logit_bias = _weight(layer.router.logit_bias)
        size = workspace_bytes(lib, config, num_tokens, dtype)
        workspace = torch.empty(size, dtype=torch.uint8, device=tokens.device)
        status = lib.deamoe_route(
            ctypes.byref(params),
            DTYPES[dtype],
            _ptr(tokens),
            _ptr(router),
            _ptr(bias),
            _ptr(logit_bias),
            num_tokens,
            *(_ptr(t) for t in outputs),
            _ptr(workspace),
            size,
            stream,
        )
        check(lib, status, "deamoe_route")
    return _routing(config, outputs, router_logits_with(lib, layer, x, stream))


def route_logits_with(
    lib: ctypes.CDLL,
    config: DeaMoEConfig,
    logits: torch.Tensor,
    router_bias: torch.Tensor | None = None,
    stream: int | None = None,
) -> Routing:
    """The kernels' routing (spec steps 1-5) of given logits [T, N]."""
    if logits.dim() != 2 or logits.shape[1] != config.num_experts:
        raise UsageError(f"logits must have shape [T, {config.num_experts}], got {list(logits.shape)}")
    if config.router_bias and router_bias is None:
        raise UsageError("the config has router_bias; pass router_bias")
    logits = logits.float().contiguous()
    # The bias is passed as float32 whatever the layer's dtype (dtype only types the bias here).
    bias = router_bias.float().contiguous() if config.router_bias else None
    outputs = _routing_outputs(config, logits.shape[0], logits.device)
    if logits.shape[0]:
        params = layer_params(config)
        status = lib.deamoe_route_logits(
            ctypes.byref(params),
            DTYPES[torch.float32],
            _ptr(logits),
            _ptr(bias),
            logits.shape[0],
            *(_ptr(t) for t in outputs),
            stream,
        )
        check(lib, status, "deamoe_route_logits")
    return _routing(config, outputs, logits)
