"""Every kernel variant (deamoeKernels.h, forwardVariant), executed on the CPU by the SIMT
emulator, against the PyTorch reference: float, int8 and int4 FFN weights, 1, 4 and 16 tokens,
on the layers the other emulated tests use, plus rows wide enough for the variants' other paths
(int8/int4 against the dequantized reference, and bit-dequant on every code, are in
test_emulated_quantized_kernel_variants.py; the shared layers in emulated_variants.py).

The reference is float32 math on the layer's weights (a quantized layer: its dequantized
weights), as in the other emulated tests; a variant may round differently only where
KERNELS.md ("Variants") says so. The default variant is the other emulated tests' subject.
Variants that run the same kernels as another for a weight format are checked bitwise
equal to it instead of against the reference again (the emulator's time is the cost):
deep-loads changes only float gate/up rows, so on quantized weights it is the default and
staged-deep is staged-down; bit-dequant changes only quantized rows. bit-dequant converts the
same codes to the same floats by other instructions, so it is also checked bitwise equal to the
default on codes that take every value at every position. staged-gate-up stages x window by
window and gives each lane the default's chunks in the default's order, so where the default
takes whole rows per warp (a row of at most 256 chunks) it is bitwise the default too.
"""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.cuda import _ops, tuning
from deamoe_trt.errors import UsageError
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.presets import PRESETS
from deamoe_trt.quant import QuantConfig
from native.cuda.emulated_variants import (
    DTYPE_AT,
    FLOAT_CONFIGS,
    FLOAT_VARIANTS,
    GATED,
    TOKENS,
    TOLERANCE,
    WIDE_ROWS,
    hidden,
    reference_fp32,
    relative_error,
    variants,
    wide_hidden,
)

pytestmark = pytest.mark.slow  # compiles the kernel library for the SIMT emulator, then emulates it


def test_the_library_names_its_variants_default_first(emulated_lib):
    names = variants(emulated_lib)
    assert names[:4] == ("default", "staged-down", "deep-loads", "staged-deep")
    assert names[4:8] == ("bit-dequant", *(name + "+bit-dequant" for name in names[1:4]))
    assert names[8:] == ("staged-gate-up", *(name + "+staged-gate-up" for name in names[1:8]))
    assert emulated_lib.deamoe_variant_name(len(names)) is None


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("name", list(FLOAT_CONFIGS))
def test_every_variant_matches_the_reference_on_float_weights(emulated_lib, name, num_tokens):
    c, dtype = FLOAT_CONFIGS[name], DTYPE_AT[num_tokens]
    layer = DeaMoELayer.random(c, seed=num_tokens, dtype=dtype)
    x = hidden(c, num_tokens, seed=10 + num_tokens, dtype=dtype)
    ref = reference_fp32(layer, x)
    for variant in FLOAT_VARIANTS:
        y = _ops.forward_with(emulated_lib, layer, x, variant=variant)
        assert y.dtype == dtype and y.shape == x.shape
        assert relative_error(y, ref) < TOLERANCE[dtype], variant


@pytest.mark.parametrize("bits", [0, 4])
def test_the_staged_variant_runs_its_own_kernel(emulated_lib, bits):
    """bf16: the staged-down variant rounds h to bf16 in shared memory, the default keeps it
    float32, so their outputs differ in the last bits when the variant really ran."""
    layer = DeaMoELayer.random(GATED, seed=3, dtype=torch.bfloat16)
    if bits:
        layer = layer.quantized(QuantConfig(bits, 32))
    x = hidden(GATED, 4, seed=4, dtype=torch.bfloat16)
    default = _ops.forward_with(emulated_lib, layer, x, variant="default")
    staged = _ops.forward_with(emulated_lib, layer, x, variant="staged-down")
    assert not torch.equal(default, staged)
    assert torch.equal(staged, _ops.forward_with(emulated_lib, layer, x, variant="staged-down"))  # deterministic


@pytest.mark.parametrize(
    ("bits", "hidden_size", "num_tokens"), [(0, 1024, 16), (4, 2048, 8), (4, 2048, 1), (8, 1024, 1)]
)
def test_staged_gate_up_keeps_each_lanes_chunks_so_the_output_is_the_defaults(
    emulated_lib, bits, hidden_size, num_tokens
):
    """bf16 rows of at most 2048 columns are one warp's by default (256 chunks): staged-gate-up's
    staged x, in two windows of 512 columns (float rows at 16 tokens) or 1024 (int4 codes at 8
    tokens), or whole (1 token), changes where each activation is read from, not which chunks a
    lane adds in which order: bitwise equal."""
    c = wide_hidden(hidden_size)
    layer = DeaMoELayer.random(c, seed=11, dtype=torch.bfloat16)
    if bits:
        layer = layer.quantized(QuantConfig(bits, 32))
    x = hidden(c, num_tokens, seed=12, dtype=torch.bfloat16)
    default = _ops.forward_with(emulated_lib, layer, x, variant="default")
    assert torch.equal(_ops.forward_with(emulated_lib, layer, x, variant="staged-gate-up"), default)


def test_staged_gate_up_runs_its_own_kernels(emulated_lib):
    """float32 rows of 1152 columns (288 chunks) are split over two warps by the default and summed
    slice by slice; staged-gate-up's warp takes the whole row, so the sums round differently."""
    c = wide_hidden(1152)
    layer = DeaMoELayer.random(c, seed=13)
    x = hidden(c, 1, seed=14, dtype=torch.float32)
    default = _ops.forward_with(emulated_lib, layer, x, variant="default")
    staged = _ops.forward_with(emulated_lib, layer, x, variant="staged-gate-up")
    assert not torch.equal(default, staged)
    assert relative_error(staged, reference_fp32(layer, x)) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("num_tokens", [1, 4])
def test_deep_loads_keep_each_lanes_order_so_the_output_is_the_defaults(emulated_lib, num_tokens):
    """More chunks in flight per lane, the same chunks in the same order per lane: bitwise equal.
    (640 float32 columns: 5 chunks per lane, two rounds of 4 by default, one of 8 here.)"""
    layer = DeaMoELayer.random(GATED.replace(hidden_size=640), seed=6)
    x = hidden(layer.config, num_tokens, seed=7, dtype=torch.float32)
    default = _ops.forward_with(emulated_lib, layer, x, variant="default")
    assert torch.equal(_ops.forward_with(emulated_lib, layer, x, variant="deep-loads"), default)
    staged = _ops.forward_with(emulated_lib, layer, x, variant="staged-down")
    assert torch.equal(_ops.forward_with(emulated_lib, layer, x, variant="staged-deep"), staged)


@pytest.mark.parametrize("bits", [4, 8])
def test_on_quantized_weights_deep_loads_run_the_default_gate_up(emulated_lib, bits):
    layer = DeaMoELayer.random(GATED, seed=bits, dtype=torch.bfloat16).quantized(QuantConfig(bits, 32))
    x = hidden(GATED, 1, seed=8, dtype=torch.bfloat16)
    pairs = ("default", "deep-loads", "staged-down", "staged-deep")
    runs = {name: _ops.forward_with(emulated_lib, layer, x, variant=name) for name in pairs}
    assert torch.equal(runs["deep-loads"], runs["default"])
    assert torch.equal(runs["staged-deep"], runs["staged-down"])


@pytest.mark.parametrize("bits", [0, 4, 8])
def test_the_variants_the_tuner_leaves_out_run_anothers_kernels(emulated_lib, bits):
    """check-gpu --tune times tuning.distinct_variants only: each variant it leaves out for a
    weight format gives bitwise the output of the variant without its inert parts."""
    names = variants(emulated_lib)
    kept = tuning.distinct_variants(names, bits)
    assert "default" in kept and len(kept) < len(names)
    layer = DeaMoELayer.random(GATED, seed=9, dtype=torch.float16)
    if bits:
        layer = layer.quantized(QuantConfig(bits, 32))
    x = hidden(GATED, 2, seed=9, dtype=torch.float16)
    runs = {name: _ops.forward_with(emulated_lib, layer, x, variant=name) for name in names}
    inert = {"bit-dequant"} if bits == 0 else {"deep-loads"}  # KERNELS.md, "Variants"
    for name in set(names) - set(kept):
        twin = next(other for other in kept if tuning.variant_parts(other) == tuning.variant_parts(name) - inert)
        assert torch.equal(runs[name], runs[twin]), (name, twin)


def test_a_variant_whose_shared_memory_would_not_fit_runs_the_default(emulated_lib):
    """16 tokens of 784-wide float32 h are 49 KiB, over the 48 KiB budget: the staged variant
    runs the default down kernel (had it launched its own, the emulator would abort on the
    request for more than 48 KiB, as a GPU would refuse it without the opt-in)."""
    c = WIDE_ROWS.replace(hidden_size=16, private_intermediate_size=784, experts_per_department=1)
    layer = DeaMoELayer.random(c, seed=5)
    x = hidden(c, 16, seed=6, dtype=torch.float32)
    y = _ops.forward_with(emulated_lib, layer, x, variant="staged-down")
    assert relative_error(y, reference_fp32(layer, x)) < TOLERANCE[torch.float32]


def test_an_unknown_variant_is_refused(emulated_lib):
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0)
    x = hidden(PRESETS["tiny"], 1, seed=0, dtype=torch.float32)
    with pytest.raises(UsageError, match="unknown kernel variant 'fastest'"):
        _ops.forward_with(emulated_lib, layer, x, variant="fastest")
    last = len(variants(emulated_lib)) - 1
    with pytest.raises(UsageError, match=rf"kernel variant must be 0\.\.{last}, got {last + 1}"):
        _ops.forward_with(emulated_lib, layer, x, variant=last + 1)


def test_host_tensors_take_the_default_variant(emulated_lib):
    """No GPU, no table: the binding's choice on the emulated library is variant 0."""
    layer = DeaMoELayer.random(GATED, seed=1, dtype=torch.bfloat16)
    x = hidden(GATED, 1, seed=1, dtype=torch.bfloat16)
    assert _ops.variant_id(emulated_lib, layer, 1, x.device, None) == 0
    assert torch.equal(_ops.forward_with(emulated_lib, layer, x), _ops.forward_with(emulated_lib, layer, x, variant=0))
