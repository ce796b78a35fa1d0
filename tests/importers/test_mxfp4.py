"""MXFP4 blocks and scales decode to exactly the values transformers' dequantization gives,
and to the OCP format's definition restated element by element."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.errors import UsageError
from deamoe_trt.importers.mxfp4 import decode_mxfp4


def _random(experts=2, rows=3, groups=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 255, (experts, rows, groups), generator=gen, dtype=torch.uint8)  # every non-NaN code
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_equals_transformers_dequantization(dtype):
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    blocks, scales = _random()
    want = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, cols, rows]
    got = decode_mxfp4(blocks, scales, dtype)  # [E, rows, cols]
    assert got.dtype == dtype
    assert torch.equal(got.transpose(1, 2), want)


def test_decode_follows_the_format_element_by_element():
    magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    blocks, scales = _random(experts=1, rows=2, groups=2, seed=1)
    got = decode_mxfp4(blocks, scales, torch.float32)
    for r in range(2):
        for col in range(64):
            byte = int(blocks[0, r, col // 32, (col % 32) // 2])
            code = byte & 0xF if col % 2 == 0 else byte >> 4
            value = (-1.0 if code & 8 else 1.0) * magnitudes[code & 7] * 2.0 ** (int(scales[0, r, col // 32]) - 127)
            # float32 rounding of the exact value: 6 * 2^127 overflows to inf, as in transformers
            assert got[0, r, col].item() == torch.tensor(value, dtype=torch.float32).item(), (r, col)


def test_a_nan_scale_or_mismatched_shapes_are_refused():
    blocks, scales = _random()
    scales[0, 0, 0] = 255
    with pytest.raises(UsageError, match="E8M0 NaN"):
        decode_mxfp4(blocks, scales)
    with pytest.raises(UsageError, match="do not match"):
        decode_mxfp4(blocks[..., :8], scales)


def test_encoding_keeps_mxfp4_values_and_rounds_others_to_the_nearest_code():
    from deamoe_trt.importers.mxfp4 import encode_mxfp4

    blocks, scales = _random(seed=2)
    scales = scales.clamp(100, 150)
    values = decode_mxfp4(blocks, scales, torch.float32)
    again = decode_mxfp4(*encode_mxfp4(values), torch.float32)
    # a block whose largest magnitude is not 6 * 2^e may take a smaller scale: same values
    assert torch.equal(again, values)
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    decoded = decode_mxfp4(*encode_mxfp4(w), torch.float32)
    step = torch.exp2(torch.ceil(torch.log2(w.reshape(8, 2, 32).abs().amax(-1) / 6))).repeat_interleave(32, -1)
    assert ((decoded - w).abs() <= step + 1e-7).all()  # the widest gap between codes, 4 -> 6, is 2 steps
