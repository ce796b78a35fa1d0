"""Layers, inputs and checks the emulated kernel tests share: the inputs and the float32
reference of test_emulated_kernels_match_reference.py, and the variant tests' layers and
variants (test_emulated_kernel_variants.py: float weights and the variants' own paths;
test_emulated_quantized_kernel_variants.py: int8/int4 against the dequantized reference and
every code bitwise; two files so a parallel run gives them to different workers, the SIMT
emulator's time being the suite's largest)."""

from __future__ import annotations

import copy

import torch

from configs import DEEPSEEK_STYLE_GROUPED, GATED_QUANTIZABLE, QWEN2_STYLE_GATED_SHARED, deepseek_style
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.cuda import _abi
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.presets import PRESETS

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOKENS = [1, 4, 16]

FLOAT_CONFIGS = {
    "tiny": PRESETS["tiny"],
    "deepseek-like": deepseek_style(hidden_size=64, experts_per_department=8, shared_expert_intermediate_size=32),
    "qwen2-moe-like": QWEN2_STYLE_GATED_SHARED,
}
# Every part kind at int4 and int8 (rows of 1-2 chunks: the narrow path of whole warps).
GATED = GATED_QUANTIZABLE
# Down rows of 17 int4 / 34 int8 chunks: wider than a half warp, the staged rows' other path.
WIDE_ROWS = DeaMoEConfig(
    hidden_size=32,
    num_departments=1,
    experts_per_department=2,
    shared_intermediate_size=0,
    private_intermediate_size=544,
    top_k=1,
    top_departments=1,
)
QUANT_CONFIGS = {"gated": GATED, "deepseek-style-grouped": DEEPSEEK_STYLE_GROUPED, "wide-rows": WIDE_ROWS}


def wide_hidden(hidden_size: int) -> DeaMoEConfig:
    """Every part kind on a wide hidden size (the emulator's time grows with it and the tokens):
    staged-gate-up's windows of x and the default's split of long rows over warps."""
    return DeaMoEConfig(
        hidden_size=hidden_size,
        num_departments=1,
        experts_per_department=2,
        shared_intermediate_size=32,
        private_intermediate_size=32,
        top_k=1,
        top_departments=1,
        shared_expert_intermediate_size=32,
    )


def hidden(c: DeaMoEConfig, num_tokens: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(num_tokens, c.hidden_size, generator=torch.Generator().manual_seed(seed)).to(dtype)


def reference_fp32(layer: DeaMoELayer, x: torch.Tensor) -> torch.Tensor:
    """The reference in float32 from the layer's (possibly rounded) weights."""
    with torch.no_grad():
        return copy.deepcopy(layer).float()(x.float())


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def variants(lib) -> tuple[str, ...]:
    return _abi.variant_names(lib)


# The variants whose kernels differ from the default's and from each other's, per weight format.
FLOAT_VARIANTS = ("staged-down", "staged-deep", "staged-gate-up", "staged-deep+staged-gate-up")
# staged-gate-up alone on codes is checked bitwise equal to the default (below); against the
# reference it runs combined with the other bits.
QUANT_VARIANTS = ("staged-down", "bit-dequant", "staged-down+bit-dequant", "staged-down+bit-dequant+staged-gate-up")


# Each token count in one dtype (every dtype over the three): the emulator's time stays small.
DTYPE_AT = {1: torch.bfloat16, 4: torch.float16, 16: torch.float32}


def every_code_everywhere(layer: DeaMoELayer, seed: int) -> DeaMoELayer:
    """The layer with its codes replaced by uniformly random bytes (any byte is a valid code
    pair or code), checked to hold every byte value at every byte position of a 32-bit word:
    every int8 code, and every int4 code in every nibble, at each place a conversion handles."""
    gen = torch.Generator().manual_seed(seed)
    seen = torch.zeros(4, 256, dtype=torch.bool)
    for name, buffer in layer.named_buffers():
        if name.endswith("qweight"):
            buffer.copy_(torch.randint(0, 256, buffer.shape, generator=gen, dtype=torch.uint8))
            flat = buffer.flatten().long()  # rows are whole 16-byte chunks: positions mod 4 hold
            seen[torch.arange(flat.numel()) % 4, flat] = True
    assert seen.all()
    return layer
