"""What a runtime's layer output must match: the spec's output in float32 math from the
layer's own weights, for a given routing, and how close each dtype must come to it."""

from __future__ import annotations

import torch

from ..activation import glu
from ..config import DeaMoEConfig
from ..quant import dense
from ..routing import Routing

# Relative error (Frobenius norm) a runtime's output may have against float32 math on the
# same weights and routing: float32 kernels agree to rounding, half-precision ones to the
# rounding of their inputs, weights and activations (bfloat16 keeps 8 bits of mantissa).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||, in float32."""
    want = want.float()
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


def swiglu32(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    config: DeaMoEConfig,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The layer's activation (deamoe_trt.activation.glu) on float32 math, biases included."""
    gate_up_out = x @ gate_up.float().t()
    if gate_up_bias is not None:
        gate_up_out = gate_up_out + gate_up_bias.float()
    gate, up = gate_up_out.chunk(2, dim=-1)
    out = glu(gate, up, config) @ down.float().t()
    return out if down_bias is None else out + down_bias.float()


def _row(bias: torch.Tensor | None, index: int) -> torch.Tensor | None:
    return None if bias is None else bias[index]


@torch.no_grad()
def float32_output(layer, x: torch.Tensor, routing: Routing) -> torch.Tensor:
    """The spec's output [T, d] in float32 from the layer's weights (a quantized layer's
    dequantized ones), for the given routing; casts only the parts the routing uses
    (memory-light for the big presets)."""
    c = layer.config
    xf = x.reshape(-1, c.hidden_size).float()
    out = torch.zeros_like(xf)
    if layer.departments is not None:
        weights = routing.department_weights(c.num_departments)
        for j in routing.used_departments().tolist():
            tokens = (routing.department_ids == j).any(dim=-1).nonzero().squeeze(-1)
            part = layer.departments
            y = swiglu32(xf[tokens], part.gate_up[j], part.down[j], c, _row(part.gate_up_bias, j))
            out.index_add_(0, tokens, y * weights[tokens, j, None])
    if layer.experts is not None:
        for e in routing.used_experts().tolist():
            tokens, slots = (routing.expert_ids == e).nonzero(as_tuple=True)
            part = layer.experts
            y = swiglu32(
                xf[tokens], part.gate_up[e], part.down[e], c, _row(part.gate_up_bias, e), _row(part.down_bias, e)
            )
            out.index_add_(0, tokens, y * routing.weights[tokens, slots, None])
    if layer.shared_experts is not None:
        shared = layer.shared_experts
        y = swiglu32(xf, dense(shared.gate_up), dense(shared.down), c, shared.gate_up_bias, shared.down_bias)
        if shared.gate is not None:
            y = y * torch.sigmoid(xf @ shared.gate.float().t())
        out += y
    return out
