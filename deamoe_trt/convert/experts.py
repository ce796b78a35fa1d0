"""A vanilla MoE layer's routed experts as per-expert gate, up and down matrices."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..activation import glu
from ..config import DeaMoEConfig
from ..errors import UsageError
from ..layer import DeaMoELayer


@dataclass
class ExpertWeights:
    """Views of a source layer's routed experts (no copies): gate_up [N, 2f, d], down [N, d, f],
    and, for a biased layer (config.ffn_bias), gate_up_bias [N, 2f] and down_bias [N, d]."""

    gate_up: torch.Tensor
    down: torch.Tensor
    config: DeaMoEConfig
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    @classmethod
    def of(cls, layer: DeaMoELayer) -> ExpertWeights:
        c = layer.config
        if c.shared_intermediate_size:
            raise UsageError(
                f"the source already has department shared parts (f_s = {c.shared_intermediate_size}); "
                "convert takes a vanilla MoE (f_s = 0), e.g. an imported Hugging Face model"
            )
        if getattr(layer, "quant", None) is not None:
            raise UsageError("the source is quantized; convert a float checkpoint, then quantize the converted one")
        experts = layer.experts
        return cls(
            gate_up=experts.gate_up.detach(),
            down=experts.down.detach(),
            config=c,
            gate_up_bias=None if experts.gate_up_bias is None else experts.gate_up_bias.detach(),
            down_bias=None if experts.down_bias is None else experts.down_bias.detach(),
        )

    @property
    def num_experts(self) -> int:
        return self.gate_up.shape[0]

    @property
    def width(self) -> int:
        return self.down.shape[2]

    @property
    def hidden_size(self) -> int:
        return self.down.shape[1]

    def expert(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate [f, d], up [f, d], down [d, f]) of expert e in float32."""
        f = self.width
        gate_up = self.gate_up[e].float()
        return gate_up[:f], gate_up[f:], self.down[e].float()

    def neuron_biases(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate bias [f], up bias [f]) of expert e in float32; zeros for an unbiased layer, so
        that neurons of either kind are handled alike (adding 0.0 changes nothing)."""
        f = self.width
        if self.gate_up_bias is None:
            return torch.zeros(f), torch.zeros(f)
        bias = self.gate_up_bias[e].float()
        return bias[:f], bias[f:]

    def activations(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """h = a(x Wg^T + b_g, x Wu^T + b_u) (the layer's activation): [T, f], float32."""
        gate, up, _ = self.expert(e)
        return neuron_activations(x, (gate, up, None, *self.neuron_biases(e)), self.config)

    def forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's output without its down bias (a converted expert keeps that bias as is)."""
        return self.activations(e, x) @ self.down[e].float().t()


def neuron_activations(x: torch.Tensor, part, config: DeaMoEConfig) -> torch.Tensor:
    """[T, f] activations of neurons part = (gate [f, d], up [f, d], down, gate bias [f], up
    bias [f]) on tokens x [T, d], float32."""
    gate, up, _, gate_bias, up_bias = part
    return glu(x @ gate.t() + gate_bias, x @ up.t() + up_bias, config)
