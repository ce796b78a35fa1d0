"""Every int8/int4 kernel variant, executed on the CPU by the SIMT emulator, against float32
math on the layer's dequantized weights (1, 4 and 16 tokens, every quantized layer of
emulated_variants), and bit-dequant bitwise equal to the default on codes of every value at
every position. The why of each check: test_emulated_kernel_variants.py's docstring."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.cuda import _ops
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.quant import QuantConfig
from native.cuda.emulated_variants import (
    DTYPE_AT,
    QUANT_CONFIGS,
    QUANT_VARIANTS,
    TOKENS,
    TOLERANCE,
    WIDE_ROWS,
    every_code_everywhere,
    hidden,
    reference_fp32,
    relative_error,
)

pytestmark = pytest.mark.slow  # compiles the kernel library for the SIMT emulator, then emulates it


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("name", list(QUANT_CONFIGS))
def test_every_variant_matches_the_dequantized_reference(emulated_lib, name, bits, num_tokens):
    c, dtype = QUANT_CONFIGS[name], DTYPE_AT[num_tokens]
    layer = DeaMoELayer.random(c, seed=bits, dtype=dtype).quantized(QuantConfig(bits, 32))
    x = hidden(c, num_tokens, seed=num_tokens, dtype=dtype)
    ref = reference_fp32(layer, x)
    for variant in QUANT_VARIANTS:
        y = _ops.forward_with(emulated_lib, layer, x, variant=variant)
        assert relative_error(y, ref) < TOLERANCE[dtype], variant


@pytest.mark.parametrize("num_tokens", [1, 16])
@pytest.mark.parametrize(("bits", "group_size"), [(4, 16), (4, 32), (8, 32)])
def test_bit_dequant_converts_every_code_as_the_default_does(emulated_lib, bits, group_size, num_tokens):
    """Bitwise equal outputs on codes of every value at every position: the conversion is
    exact (int4 at group size 16: two scales per chunk; 16 tokens: int4's pieces one at a time)."""
    layer = DeaMoELayer.random(WIDE_ROWS, seed=bits, dtype=torch.bfloat16).quantized(QuantConfig(bits, group_size))
    layer = every_code_everywhere(layer, seed=group_size)
    x = hidden(WIDE_ROWS, num_tokens, seed=3, dtype=torch.bfloat16)
    pairs = ("default", "bit-dequant", "staged-down", "staged-down+bit-dequant")
    runs = {name: _ops.forward_with(emulated_lib, layer, x, variant=name) for name in pairs}
    assert torch.equal(runs["bit-dequant"], runs["default"])
    assert torch.equal(runs["staged-down+bit-dequant"], runs["staged-down"])
    assert relative_error(runs["bit-dequant"], reference_fp32(layer, x)) < TOLERANCE[torch.bfloat16]
