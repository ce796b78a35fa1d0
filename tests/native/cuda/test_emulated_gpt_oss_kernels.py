"""The CUDA kernels on gpt-oss's layer (FFN biases, the clamped SwiGLU, a router logit bias),
executed on the CPU by the SIMT emulator, against the spec's independent reference.

GPT_OSS_STYLE (tests/configs.py) has every part: department shared neurons (gate/up biases,
no down bias), expert private neurons (gate/up and down biases), an ungated shared expert
(both), a logit bias on the router and a clamp limit of 1.0, so that random unit-scale
inputs clamp many neurons. The expectation is tests/spec_reference.spec_forward (float64,
from the layer's canonical tensors; quantized layers through spec_dequantized_tensors), and
the routing and logits are checked against deamoe_trt.routing's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs import GPT_OSS_STYLE, gpt_oss_style
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.cuda import _ops
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.quant import QuantConfig
from spec_reference import spec_dequantized_tensors, spec_forward

pytestmark = pytest.mark.slow  # compiles the kernel library for the SIMT emulator, then emulates it

# Relative error the kernels reach per dtype: float32 math throughout; half precision on
# the same rounded weights, only the output rounded (the float tests' bounds).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Every width a whole number of 16-byte rows of int4 codes (32 columns).
GPT_OSS_QUANTIZABLE = gpt_oss_style(
    shared_intermediate_size=32, private_intermediate_size=32, shared_expert_intermediate_size=32
)


def hidden(c: DeaMoEConfig, num_tokens: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(num_tokens, c.hidden_size, generator=torch.Generator().manual_seed(seed)).to(dtype)


def spec_output(layer: DeaMoELayer, x: torch.Tensor, quant: QuantConfig | None = None) -> np.ndarray:
    """spec_forward on the layer's canonical tensors (numpy has no bfloat16: float32 copies
    of the rounded values; a quantized layer's codes as stored)."""
    state = {name: t if name.endswith(".qweight") else t.float() for name, t in layer.state_dict().items()}
    if quant is not None:
        tensors = spec_dequantized_tensors(state, quant.bits, quant.group_size)
    else:
        tensors = {name: t.numpy() for name, t in state.items()}
    return spec_forward(x.float().numpy(), tensors, layer.config)


def relative_error(y: torch.Tensor, ref: np.ndarray) -> float:
    ref64 = torch.from_numpy(ref)
    return float((y.double() - ref64).norm() / ref64.norm())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_forward_matches_the_spec(emulated_lib, dtype, num_tokens):
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=1, dtype=DTYPES[dtype])
    x = hidden(GPT_OSS_STYLE, num_tokens, seed=num_tokens, dtype=DTYPES[dtype])
    y = _ops.forward_with(emulated_lib, layer, x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert relative_error(y, spec_output(layer, x)) < TOLERANCE[DTYPES[dtype]]


def test_forward_fp32_equals_the_reference_layer_over_a_tile_and_into_the_next(emulated_lib):
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=3)
    x = hidden(GPT_OSS_STYLE, 17, seed=7)
    torch.testing.assert_close(_ops.forward_with(emulated_lib, layer, x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("bits", "group_size", "dtype"),
    [(4, 16, "fp32"), (4, 16, "bf16"), (8, 16, "fp16"), (8, 16, "fp32"), (4, 16, "fp16"), (8, 16, "bf16")],
)
def test_quantized_forward_matches_the_dequantized_spec(emulated_lib, bits, group_size, dtype):
    # The biases stay in the activation dtype beside the codes (never quantized).
    quant = QuantConfig(bits, group_size)
    layer = DeaMoELayer.random(GPT_OSS_QUANTIZABLE, seed=4, dtype=DTYPES[dtype]).quantized(quant)
    x = hidden(GPT_OSS_QUANTIZABLE, 3, seed=8, dtype=DTYPES[dtype])
    y = _ops.forward_with(emulated_lib, layer, x)
    assert relative_error(y, spec_output(layer, x, quant)) < TOLERANCE[DTYPES[dtype]]


@pytest.mark.parametrize(
    "change",
    [
        {"activation": "swiglu"},  # biases with the plain SwiGLU
        {"ffn_bias": False},  # the clamp and the logit bias alone
        {"router_logit_bias": False, "shared_expert_intermediate_size": 0},
        {"shared_intermediate_size": 0},  # no department part: expert biases only
    ],
    ids=["swiglu", "no-ffn-bias", "no-logit-bias", "experts-only"],
)
def test_each_extension_alone_matches_the_spec(emulated_lib, change):
    c = gpt_oss_style(**change)
    layer = DeaMoELayer.random(c, seed=5)
    x = hidden(c, 3, seed=9)
    assert relative_error(_ops.forward_with(emulated_lib, layer, x), spec_output(layer, x)) < 1e-5


@torch.no_grad()
def test_the_extensions_change_the_output_beyond_the_tolerance(emulated_lib):
    # The comparisons above could not pass with a kernel that ignored a bias or the clamp:
    # each one moves the spec's output by far more than the float32 bound.
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=1)
    x = hidden(GPT_OSS_STYLE, 5, seed=5)
    y = _ops.forward_with(emulated_lib, layer, x)
    state = {name: t.numpy() for name, t in layer.state_dict().items()}
    for name in [n for n in state if "bias" in n]:
        without = {**state, name: np.zeros_like(state[name])}
        assert relative_error(y, spec_forward(x.numpy(), without, GPT_OSS_STYLE)) > 1e-3, name
    unclamped = GPT_OSS_STYLE.replace(swiglu_limit=1000.0)
    assert relative_error(y, spec_forward(x.numpy(), state, unclamped)) > 1e-3, "the clamp"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_router_logits_and_routing_carry_the_logit_bias(emulated_lib, dtype):
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=6, dtype=DTYPES[dtype])
    x = hidden(GPT_OSS_STYLE, 4, seed=10, dtype=DTYPES[dtype])
    logits = _ops.router_logits_with(emulated_lib, layer, x)
    want = x.float() @ layer.router.weight.float().t() + layer.router.logit_bias
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    got, ref = _ops.route_with(emulated_lib, layer, x), layer.route(x)
    assert torch.equal(got.expert_ids, ref.expert_ids)
    torch.testing.assert_close(got.weights, ref.weights, rtol=2e-6, atol=1e-7)


def test_float32_router_rows_in_a_half_precision_layer_carry_the_logit_bias(emulated_lib):
    # A float32 router.weight in a bf16 layer has its own logits kernel (spec, "Router precision").
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=7, dtype=torch.bfloat16)
    layer.router.weight.data = layer.router.weight.data.float()
    assert layer.router_dtype == torch.float32
    x = hidden(GPT_OSS_STYLE, 3, seed=11, dtype=torch.bfloat16)
    logits = _ops.router_logits_with(emulated_lib, layer, x)
    want = x.float() @ layer.router.weight.t() + layer.router.logit_bias
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    y = _ops.forward_with(emulated_lib, layer, x)
    assert relative_error(y, spec_output(layer, x)) < TOLERANCE[torch.bfloat16]
