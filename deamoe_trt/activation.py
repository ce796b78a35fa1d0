"""The FFN activation of every part of a layer (spec, "Clamped SwiGLU"): one function.

`swiglu`:          a = silu(g) * u
`swiglu_clamped`:  g' = min(g, limit), u' = clamp(u, -limit, limit),
                   a = (u' + 1) * g' * sigmoid(alpha * g')   (gpt-oss)
applied per neuron after the gate/up biases.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .config import DeaMoEConfig


def glu(gate: torch.Tensor, up: torch.Tensor, config: DeaMoEConfig) -> torch.Tensor:
    """The activation a of neurons with gate pre-activations g and up pre-activations u."""
    if config.activation == "swiglu":
        return F.silu(gate) * up
    limit = config.swiglu_limit
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(config.swiglu_alpha * gate)


def swiglu(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    config: DeaMoEConfig | None = None,
    *,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """F(x) = a(x Wg^T + b_g, x Wu^T + b_u) Wd^T (+ b_d) with gate_up = [Wg; Wu] ([2f, d]),
    down [d, f], gate_up_bias [2f] (gate entries, then up), down_bias [d]. config None: plain
    SwiGLU."""
    gate, up = F.linear(x, gate_up, gate_up_bias).chunk(2, dim=-1)
    hidden = F.silu(gate) * up if config is None else glu(gate, up, config)
    return F.linear(hidden, down, down_bias)
