"""A vanilla MoE layer's routed experts as per-expert gate, up and down matrices."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..errors import UsageError
from ..layer import DeaMoELayer


@dataclass
class ExpertWeights:
    """Views of a source layer's routed experts (no copies): gate_up [N, 2f, d], down [N, d, f]."""

    gate_up: torch.Tensor
    down: torch.Tensor

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
        return cls(gate_up=layer.experts.gate_up.detach(), down=layer.experts.down.detach())

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

    def activations(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """h = silu(x Wg^T) * (x Wu^T): [T, f], float32."""
        gate, up, _ = self.expert(e)
        return F.silu(x @ gate.t()) * (x @ up.t())

    def forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.activations(e, x) @ self.down[e].float().t()
