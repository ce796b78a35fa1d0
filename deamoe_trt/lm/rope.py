"""Rotary position embeddings: the default (Llama) frequencies and the scaled variants that
Hugging Face MoE configs set (linear, YaRN), as cos/sin tables.

The tables are computed in float64 and rounded once to float32, so they do not depend on
the device or on float32 rounding of position * frequency. `rope_scaling` uses Hugging
Face's keys ("rope_type" or the older "type", "factor", YaRN's
"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
"mscale_all_dim", "truncate"), so a config's dict is copied as it is.

Types whose frequencies change with the sequence length (dynamic NTK, LongRoPE) are refused:
a KV cache built under one scaling cannot be continued under another.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..config import ConfigError

ROPE_TYPES = ("default", "linear", "yarn")


def rope_type(scaling: dict[str, Any] | None) -> str:
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def check_rope_scaling(scaling: Any) -> None:
    if not isinstance(scaling, dict):
        raise ConfigError(f"rope_scaling must be null or a JSON object, got {scaling!r}")
    kind = rope_type(scaling)
    if kind not in ROPE_TYPES:
        raise ConfigError(
            f"rope_scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)} "
            "(dynamic and longrope rescale with the sequence length, which a KV cache cannot follow)"
        )
    if kind == "default":
        return
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ConfigError(f"rope_scaling {kind} needs a factor > 0, got {factor!r}")
    if kind == "yarn":
        original = scaling.get("original_max_position_embeddings")
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ConfigError(f"rope_scaling yarn needs original_max_position_embeddings >= 1, got {original!r}")


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int
) -> tuple[torch.Tensor, float]:
    """inv_freq [head_dim // 2] (float64) and the factor applied to cos and sin."""
    half = head_dim // 2
    exponents = torch.arange(half, dtype=torch.float64) / half
    inv_freq = 1.0 / (theta**exponents)
    kind = rope_type(scaling)
    if kind == "default":
        return inv_freq, 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    return _yarn(inv_freq, head_dim, theta, factor, scaling)


def _yarn(
    inv_freq: torch.Tensor, dim: int, theta: float, factor: float, s: dict[str, Any]
) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as transformers computes it: frequencies blended between
    interpolated (inv_freq / factor) and original by a linear ramp over dimensions, and
    cos/sin scaled by the attention factor."""
    original = int(s["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    blended = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return blended, float(attention)


def rope_tables(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_positions, head_dim // 2] in float32 (Llama's non-interleaved rotary)."""
    inv_freq, attention = inverse_frequencies(head_dim, theta, scaling, max_positions)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq.to(torch.float64)
    cos, sin = angles.cos() * attention, angles.sin() * attention
    return cos.float().to(device), sin.float().to(device)
