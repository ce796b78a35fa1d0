"""MXFP4 (OCP Microscaling FP4) weights as gpt-oss checkpoints store them, decoded exactly.

A tensor W [..., rows, cols] is stored as two uint8 tensors:
- `*_blocks` [..., rows, cols / 32, 16]: two FP4 E2M1 codes per byte, the low nibble first
  (element 2j in the low four bits of byte j, element 2j + 1 in the high four);
- `*_scales` [..., rows, cols / 32]: one E8M0 exponent per 32 consecutive elements of a row,
  the scale 2^(s - 127).

An E2M1 code is a sign bit and three magnitude bits that index 0, 0.5, 1, 1.5, 2, 3, 4, 6, so
every decoded value is a small integer times a power of two: exact in float32 and bfloat16
(whose exponent range is float32's), the values transformers' own dequantization gives.

`encode_mxfp4` is the inverse up to rounding (round to nearest, per block the smallest power
of two that keeps every value within +-6): how tests build MXFP4 checkpoints and how
docs/quantization.md measures what MXFP4 -> int4 costs.
"""

from __future__ import annotations

import torch

from ..errors import UsageError

# The E2M1 magnitudes by code (bit 3 is the sign).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BLOCK = 32  # elements per scale
SCALE_BIAS = 127
SCALE_NAN = 255  # E8M0's one code that is not a power of two


def fp4_values(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 E2M1 code values, positive codes first."""
    return torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=dtype)


def decode_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16, name: str = ""
) -> torch.Tensor:
    """[..., rows, cols] in dtype from blocks [..., rows, cols / 32, 16] and scales [..., rows, cols / 32]."""
    what = f"{name}: " if name else ""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise UsageError(f"{what}MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise UsageError(
            f"{what}MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match "
            f"(blocks must be the scales' shape plus {BLOCK // 2} bytes)"
        )
    if bool((scales == SCALE_NAN).any()):
        raise UsageError(f"{what}an MXFP4 scale is {SCALE_NAN} (E8M0 NaN); the checkpoint is damaged")
    lut = fp4_values()
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()  # [..., G, 16, 2]: low nibble first
    values = lut[codes].flatten(-3)  # [..., G * 32]
    exponents = (scales.int() - SCALE_BIAS).repeat_interleave(BLOCK, dim=-1)
    return torch.ldexp(values, exponents).to(dtype)


def encode_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., cols] (cols a multiple of 32) -> (blocks [..., cols / 32, 16], scales [..., cols / 32])."""
    if w.shape[-1] % BLOCK:
        raise UsageError(f"MXFP4 needs a multiple of {BLOCK} columns, got {w.shape[-1]}")
    groups = w.float().reshape(*w.shape[:-1], -1, BLOCK)
    amax = groups.abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
    exponent = torch.ceil(torch.log2(amax / E2M1[-1])).clamp(-SCALE_BIAS, SCALE_BIAS)
    scaled = groups / torch.exp2(exponent)
    magnitudes = torch.tensor(E2M1)
    code = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1) | ((scaled < 0).long() << 3)
    pairs = code.reshape(*code.shape[:-1], BLOCK // 2, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    return blocks, (exponent[..., 0] + SCALE_BIAS).to(torch.uint8)
