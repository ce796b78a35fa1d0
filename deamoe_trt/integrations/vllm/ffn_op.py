"""The DeaMoE FFN as a registered torch.library custom op, deamoe::cpu_ffn, for the vLLM model.

`cpu_ffn(x, handle)` runs one block's DeaMoE FFN (routing included) on deamoe-trt's CPU kernel
(deamoe_trt.cpu.CpuDeaMoE): the layer is registered once under an integer handle, so the op's
signature holds tensors and ints only, as torch.library requires; its fake implementation
gives vLLM's tracing the output's shape. The vLLM model runs it in place of its two FusedMoE
layers where `ffn_choice` says so:

- DEAMOE_VLLM_FFN=cpu-kernel or fusedmoe chooses outright (every process of the engine
  inherits it);
- otherwise DEFAULT_FFN for floating-point models (the faster where measured) and
  QUANTIZED_DEFAULT_FFN for int4/int8 ones (the exact one, within 12% of vLLM's int4 kernel
  where measured): `python -m deamoe_trt.integrations.vllm.bench --ffn [--quantized 4]`;
  docs/benchmarks.md, "The DeaMoE FFN on vLLM's CPU engine".

The CPU kernel runs float32 and float16 models (their int4/int8 FFNs too, from the checkpoint's
codes and scales: the checkpoint's own math, where vLLM's CPU int4 MoE kernel rounds the
activations to int8), not bfloat16 ones; for those, and off the CPU, vLLM's FusedMoE runs.
"""

from __future__ import annotations

import os

import torch

from ...errors import UsageError

ENV = "DEAMOE_VLLM_FFN"
FFN_CHOICES = ("fusedmoe", "cpu-kernel")
# The choices where no DEAMOE_VLLM_FFN is set (see the module docstring for the measurements).
DEFAULT_FFN = "fusedmoe"
QUANTIZED_DEFAULT_FFN = "cpu-kernel"
KERNEL_DTYPES = (torch.float32, torch.float16)

_LAYERS: dict[int, object] = {}


def ffn_choice(*, cpu: bool, dtype: torch.dtype, quantized: bool) -> str:
    """ "cpu-kernel" or "fusedmoe" for a model of dtype on this platform (see the module docstring)."""
    wanted = os.environ.get(ENV, "").strip() or (QUANTIZED_DEFAULT_FFN if quantized else DEFAULT_FFN)
    if wanted not in FFN_CHOICES:
        raise UsageError(f"{ENV}={wanted!r} is not one of {', '.join(FFN_CHOICES)}")
    if wanted == "cpu-kernel" and (not cpu or dtype not in KERNEL_DTYPES):
        return "fusedmoe"
    return wanted


def register_layer(layer) -> int:
    """A handle for layer (a deamoe_trt.cpu.CpuDeaMoE) that cpu_ffn runs."""
    handle = len(_LAYERS)
    _LAYERS[handle] = layer
    return handle


@torch.library.custom_op("deamoe::cpu_ffn", mutates_args=())
def cpu_ffn(x: torch.Tensor, handle: int) -> torch.Tensor:
    """The FFN output [T, d] (x's dtype) of the layer registered under handle, for x [T, d]."""
    return _LAYERS[handle](x).to(x.dtype)


@cpu_ffn.register_fake
def _cpu_ffn_shape(x: torch.Tensor, handle: int) -> torch.Tensor:
    return torch.empty_like(x)


def ffn_kinds(model) -> list[str]:
    """Which FFN each block of a vLLM DeaMoEForCausalLM runs ("KernelFFN": this op; "DeaMoEFFN":
    FusedMoE; a dense block's MLP), for `vllm.LLM.apply_model`, which needs an importable function."""
    return [type(block.mlp).__name__ for block in model.layers]
