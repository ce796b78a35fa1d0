"""Weight-only int8/int4 quantization of the FFN weights (spec, "Weight-only quantization").

One format, ONNX Runtime's com.microsoft.QMoE layout, so that the `ort` export passes the
checkpoint's bytes through unchanged (docs/quantization.md):

- a weight [..., rows, cols] (nn.Linear orientation: cols is the input dimension) is cut
  into groups of `group_size` consecutive columns; each (row, group) has one scale;
- codes are unsigned with an implicit zero point 2^(bits-1) (8 for int4, 128 for int8),
  the symmetric form QMoE assumes when no zero points are given:
  w = scale * (q - zero_point);
- int8: one code per byte, qweight [..., rows, cols]; int4: two codes per byte, the even
  column in the low nibble, qweight [..., rows, cols / 2];
- scales [..., rows, cols / group_size] in the checkpoint's dtype.

`dequantize` is the one definition of what a quantized checkpoint means: the reference runs
it, every backend is validated against what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import UsageError

BITS = (4, 8)
GROUP_SIZES = (16, 32, 64, 128)
# rtn: round to nearest, scale = max|w| / qmax. awq: activation-aware (deamoe_trt.quantize.awq): the
# same codes and scales, chosen with calibration tokens; the format does not change.
METHODS = ("rtn", "awq")


def zero_point(bits: int) -> int:
    """The implicit zero point of unsigned codes: 8 for int4, 128 for int8 (QMoE's default)."""
    return 1 << (bits - 1)


@dataclass(frozen=True)
class QuantConfig:
    """How a checkpoint's FFN weights are stored: bits per weight, columns per scale, method."""

    bits: int
    group_size: int
    method: str = "rtn"

    def __post_init__(self):
        if self.bits not in BITS:
            raise UsageError(f"unsupported bits {self.bits!r}: choose 4 or 8")
        if self.group_size not in GROUP_SIZES:
            raise UsageError(f"unsupported group size {self.group_size!r}: choose one of 16, 32, 64, 128")
        if self.method not in METHODS:
            raise UsageError(f"unsupported quantization method {self.method!r}: choose one of {', '.join(METHODS)}")

    def to_dict(self) -> dict:
        return {
            "bits": self.bits,
            "group_size": self.group_size,
            "method": self.method,
            "zero_point": zero_point(self.bits),
            "packing": "onnxruntime-qmoe",
        }

    @classmethod
    def from_dict(cls, data) -> QuantConfig:
        if not isinstance(data, dict):
            raise UsageError(f"quantization must be an object with bits and group_size, got {data!r}")
        config = cls(data.get("bits"), data.get("group_size"), data.get("method", "rtn"))
        if data.get("zero_point", zero_point(config.bits)) != zero_point(config.bits):
            raise UsageError(f"quantization zero_point must be {zero_point(config.bits)} for {config.bits} bits")
        return config

    def packed_shape(self, shape) -> tuple[int, ...]:
        *lead, cols = shape
        return (*lead, cols * self.bits // 8)

    def scale_shape(self, shape) -> tuple[int, ...]:
        *lead, cols = shape
        return (*lead, cols // self.group_size)

    def nbytes(self, numel: int, scale_bytes: int) -> int:
        """Bytes of numel weights stored so: packed codes plus one scale per group."""
        return numel * self.bits // 8 + numel // self.group_size * scale_bytes

    def check_width(self, what: str, cols: int) -> None:
        if cols % self.group_size:
            raise UsageError(
                f"{what} is {cols}, not divisible by the group size {self.group_size}; "
                "choose a group size that divides it"
            )


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes [..., n] (uint8, < 2^bits) -> qweight bytes [..., n * bits / 8]."""
    codes = codes.to(torch.uint8)
    if bits == 8:
        return codes.contiguous()
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """qweight bytes [..., m] -> unsigned codes [..., m * 8 / bits] (uint8)."""
    if bits == 8:
        return qweight
    low, high = qweight & 0x0F, qweight >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The weights a quantized tensor stands for: scale * (q - zero_point), computed in float32
    (exact: a small integer times the scale, one rounding) and returned in `dtype` (default:
    the scales' dtype)."""
    codes = unpack(qweight, bits).to(torch.float32) - zero_point(bits)
    *lead, cols = codes.shape
    grouped = codes.view(*lead, cols // group_size, group_size) * scales.to(torch.float32).unsqueeze(-1)
    return grouped.view(*lead, cols).to(dtype or scales.dtype)


def quantize_rtn(
    weight: torch.Tensor, config: QuantConfig, clip: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest symmetric quantization of weight [..., rows, cols] -> (qweight, scales).

    scale = clip * max |w| over the group / qmax (7 for int4, 127 for int8), rounded to the
    weight's dtype first so that the codes are the nearest for the scale actually stored.
    clip: [..., rows, cols / group_size] ratios in (0, 1] (AWQ's clipping search,
    deamoe_trt.quantize.awq); default 1, plain round to nearest."""
    bits, gs = config.bits, config.group_size
    *lead, cols = weight.shape
    if cols % gs:
        raise UsageError(f"a weight with {cols} input columns is not divisible by the group size {gs}")
    if weight.dim() == 3:
        # One group of the stack at a time: a layer's experts are gigabytes, and the float32
        # temporaries below would hold several copies of all of them at once.
        pairs = [quantize_rtn(part, config, None if clip is None else clip[i]) for i, part in enumerate(weight)]
        return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
    w = weight.detach().to(torch.float32).reshape(*lead, cols // gs, gs)
    scales = group_scales(w, bits, weight.dtype, clip)
    codes = (round_to_grid(w, scales, bits) + zero_point(bits)).to(torch.uint8).reshape(*lead, cols)
    return pack(codes, bits), scales.contiguous()


def group_scales(
    grouped: torch.Tensor, bits: int, dtype: torch.dtype, clip: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Scales [..., groups] in dtype for float32 weights [..., groups, group_size]:
    clip * max|w| / qmax; an all-zero group gets 1 (any scale works; 1 keeps codes at zero)."""
    absmax = grouped.abs().amax(dim=-1)
    if clip is not None:
        absmax = absmax * clip
    scales = (absmax / (zero_point(bits) - 1)).to(dtype)
    return torch.where(scales == 0, torch.ones_like(scales), scales)


def round_to_grid(grouped: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed codes (float32) of weights [..., groups, group_size] for scales [..., groups]:
    round(w / scale) clamped to [-2^(bits-1), 2^(bits-1) - 1]."""
    q = torch.round(grouped / scales.to(torch.float32).unsqueeze(-1))
    return q.clamp(-zero_point(bits), zero_point(bits) - 1)


class QuantizedWeight(nn.Module):
    """A stacked weight stored quantized: buffers qweight and scales (state_dict names
    "<weight>.qweight" and "<weight>.scales"). Indexing dequantizes one group, as a
    Parameter's indexing returns it; `dense()` dequantizes all."""

    qweight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, shape, config: QuantConfig, *, dtype: torch.dtype, device=None):
        super().__init__()
        self.shape = tuple(shape)
        self.config = config
        self.register_buffer("qweight", torch.empty(config.packed_shape(shape), dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.empty(config.scale_shape(shape), dtype=dtype, device=device))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights dequantize to: the scales' (Module.to(dtype) casts them)."""
        return self.scales.dtype

    def __getitem__(self, index) -> torch.Tensor:
        return dequantize(self.qweight[index], self.scales[index], self.config.bits, self.config.group_size, self.dtype)

    def dense(self) -> torch.Tensor:
        return dequantize(self.qweight, self.scales, self.config.bits, self.config.group_size, self.dtype)

    @torch.no_grad()
    def set_from(self, weight: torch.Tensor, clip: torch.Tensor | None = None) -> None:
        qweight, scales = quantize_rtn(weight, self.config, clip)
        self.qweight.copy_(qweight)
        self.scales.copy_(scales)

    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, bits={self.config.bits}, group_size={self.config.group_size}"


def dense(weight) -> torch.Tensor:
    """A weight as a dense tensor, whether stored plain or quantized."""
    return weight.dense() if isinstance(weight, QuantizedWeight) else weight
