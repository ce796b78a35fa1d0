"""The CUDA kernels on int4/int8 FFN weights (W4A16 / W8A16), executed on the CPU by the
SIMT emulator, against the PyTorch reference running the dequantized checkpoint.

The layers are DeaMoELayer.quantized(QuantConfig(bits, group_size)) (deamoe_trt.quant): the
kernels read the packed codes and the scales as stored and dequantize in registers; the
reference is the same layer in PyTorch, whose weights are quant.dequantize of those codes
(float32 math on them for the half-precision layers, as the float tests do: the kernels
accumulate in float32 and never round a dequantized weight to the dtype).
"""

from __future__ import annotations

import copy
import ctypes

import pytest
import torch

from configs import DEEPSEEK_STYLE_GROUPED, GATED_QUANTIZABLE
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.cuda import _abi, _ops
from deamoe_trt.cuda._ops import KernelError
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.presets import PRESETS
from deamoe_trt.quant import QuantConfig

pytestmark = pytest.mark.slow  # the emulated kernel library takes a minute to compile

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}

# GATED (configs.GATED_QUANTIZABLE): every part kind, widths of whole int4 rows and groups up
# to 32. (DEEPSEEK_STYLE_GROUPED: sigmoid, bias, sum_top2, an ungated shared expert.)
GATED = GATED_QUANTIZABLE
# Widths of whole groups of 64 and 128 (one scale for several chunks), kept small: the
# emulator's cost grows with the blocks.
WIDE_GROUPS = DeaMoEConfig(
    hidden_size=128,
    num_departments=1,
    experts_per_department=2,
    shared_intermediate_size=0,
    private_intermediate_size=128,
    top_k=1,
    top_departments=1,
)


def hidden(c: DeaMoEConfig, num_tokens: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(num_tokens, c.hidden_size, generator=torch.Generator().manual_seed(seed)).to(dtype)


def quantized_layer(c: DeaMoEConfig, bits: int, group_size: int, dtype: torch.dtype, seed: int) -> DeaMoELayer:
    return DeaMoELayer.random(c, seed=seed, dtype=dtype).quantized(QuantConfig(bits, group_size))


def dequantized_reference(layer: DeaMoELayer, x: torch.Tensor) -> torch.Tensor:
    """The quantized layer in PyTorch, float32 (its weights: dequantize(codes, scales))."""
    with torch.no_grad():
        return copy.deepcopy(layer).float()(x.float())


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


CASES = [
    # (config, bits, group size, dtype): both bit widths, every group size, every dtype.
    (GATED, 4, 16, torch.float32),  # int4 at group size 16: two scales per 16-byte chunk
    (DEEPSEEK_STYLE_GROUPED, 4, 32, torch.bfloat16),
    (GATED, 4, 32, torch.float16),
    (WIDE_GROUPS, 4, 128, torch.bfloat16),
    (DEEPSEEK_STYLE_GROUPED, 8, 16, torch.float32),
    (GATED, 8, 32, torch.bfloat16),
    (WIDE_GROUPS, 8, 64, torch.float16),
    (WIDE_GROUPS, 8, 128, torch.float32),
]


@pytest.mark.parametrize(
    ("config", "bits", "group_size", "dtype"),
    CASES,
    ids=[f"int{b}-g{g}-{str(t).removeprefix('torch.')}-d{c.hidden_size}" for c, b, g, t in CASES],
)
def test_quantized_forward_matches_the_dequantized_reference(emulated_lib, config, bits, group_size, dtype):
    layer = quantized_layer(config, bits, group_size, dtype, seed=bits + group_size)
    x = hidden(config, 3, seed=group_size, dtype=dtype)
    y = _ops.forward_with(emulated_lib, layer, x)
    assert y.dtype == dtype and y.shape == x.shape
    ref = dequantized_reference(layer, x)
    assert relative_error(y, ref) < TOLERANCE[dtype]
    # The bound can fail: the float weights the codes came from are several times further
    # from the dequantized reference than the kernels are.
    with torch.no_grad():
        unquantized = DeaMoELayer.random(config, seed=bits + group_size, dtype=dtype).float()(x.float())
    assert relative_error(y, ref) < relative_error(unquantized, ref) / 3


def test_quantized_forward_over_a_full_tile_and_into_the_next(emulated_lib):
    """17 tokens: a 16-token tile (every token through every shared-expert row, many parts)
    and a 1-token tile, the reference decision for decision (int4: int8 differs only in the
    dequantization, which the cases above cover at every tile up to 4 tokens)."""
    layer = quantized_layer(GATED, 4, 32, torch.float32, seed=5)
    x = hidden(GATED, 17, seed=6)
    y = _ops.forward_with(emulated_lib, layer, x)
    torch.testing.assert_close(y, dequantized_reference(layer, x), rtol=1e-5, atol=1e-5)


def test_quantized_float32_router_in_a_bf16_layer(emulated_lib):
    """The router is never quantized: a float32 router (spec, "Router precision") stays float32
    in an int4 layer whose codes and scales are bf16-scaled."""
    layer = DeaMoELayer.random(GATED, seed=8).to(torch.bfloat16).quantized(QuantConfig(4, 16))
    assert layer.router_dtype == torch.float32 and layer.dtype == torch.bfloat16
    x = hidden(GATED, 2, seed=9, dtype=torch.bfloat16)
    assert torch.equal(_ops.route_with(emulated_lib, layer, x).expert_ids, layer.route(x).expert_ids)
    assert relative_error(_ops.forward_with(emulated_lib, layer, x), dequantized_reference(layer, x)) < 1e-2


def test_quantized_forward_is_bitwise_deterministic(emulated_lib):
    layer = quantized_layer(GATED, 4, 16, torch.bfloat16, seed=7)
    x = hidden(GATED, 3, seed=8, dtype=torch.bfloat16)
    first = _ops.forward_with(emulated_lib, layer, x)
    assert torch.equal(first, _ops.forward_with(emulated_lib, layer, x))


def params_with(config: DeaMoEConfig, bits: int, group_size: int) -> _abi.LayerParams:
    params = _abi.LayerParams.from_buffer_copy(_abi.layer_params(config))
    params.weightBits, params.weightGroupSize = bits, group_size
    return params


@pytest.mark.parametrize(
    ("bits", "group_size", "changes", "status", "limit"),
    [
        (3, 32, {}, 1, "weight_bits must be 0 (float), 4 or 8, got 3"),
        (4, 24, {}, 1, "weight_group_size must be 16, 32, 64 or 128 for int4 weights, got 24"),
        (0, 32, {}, 1, "weight_group_size must be 0 when weight_bits is 0, got 32"),
        (8, 64, {}, 1, "shared_intermediate_size 32 is not divisible by weight_group_size 64"),
        # tiny's f_p = 16 int4 codes are 8 bytes: not a whole 16-byte vector.
        (4, 16, {}, 3, "private_intermediate_size 16 must be a multiple of 32 for int4 weights"),
        (4, 16, dict(private_intermediate_size=32), 0, ""),
        (8, 16, {}, 0, ""),
    ],
)
def test_check_supported_names_the_quantization_limit(emulated_lib, bits, group_size, changes, status, limit):
    params = params_with(PRESETS["tiny"].replace(**changes), bits, group_size)
    assert emulated_lib.deamoe_check_supported(ctypes.byref(params), _abi.DTYPES[torch.bfloat16]) == status
    assert limit in emulated_lib.deamoe_last_error().decode()
    if status == 1:  # validate() itself refuses, so the workspace size is 0 as for any invalid params
        assert emulated_lib.deamoe_validate(ctypes.byref(params)) == 1
        assert emulated_lib.deamoe_workspace_size(ctypes.byref(params), 4, 0) == 0


def test_missing_scales_are_an_invalid_argument(emulated_lib):
    layer = quantized_layer(GATED, 8, 16, torch.float32, seed=0)
    x = hidden(GATED, 1, seed=0)
    out = torch.empty_like(x)
    params = _abi.layer_params(GATED, False, layer.quant)
    weights, keep = _ops.layer_weights(layer)
    weights.expertDownScales = None
    size = _ops.workspace_bytes(emulated_lib, GATED, 1, torch.float32)
    workspace = torch.empty(size, dtype=torch.uint8)
    status = emulated_lib.deamoe_forward(
        ctypes.byref(params), ctypes.byref(weights), 0, x.data_ptr(), out.data_ptr(), 1,
        workspace.data_ptr(), size, None,
    )  # fmt: skip
    assert status == 2
    assert emulated_lib.deamoe_last_error() == b"experts.down.scales is null"
    del keep


def test_the_binding_passes_the_layers_quantization(emulated_lib):
    """LayerParams carry layer.quant (0/0 for a float layer), so a layer the kernels cannot run
    quantized is refused in one line naming the limit, before any launch."""
    assert (_abi.layer_params(GATED).weightBits, _abi.layer_params(GATED).weightGroupSize) == (0, 0)
    tiny = PRESETS["tiny"]
    layer = quantized_layer(tiny, 4, 16, torch.float32, seed=1)
    with pytest.raises(KernelError, match="private_intermediate_size 16 must be a multiple of 32 for int4 weights"):
        _ops.forward_with(emulated_lib, layer, hidden(tiny, 1, seed=0))
