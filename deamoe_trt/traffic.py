"""Weights loaded per decoding step: the metric the project exists for (spec, "Weights loaded per step")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DeaMoEConfig
from .quant import QuantConfig
from .routing import Routing, route_logits

BYTES_PER_WEIGHT = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


@dataclass(frozen=True)
class StepTraffic:
    """Bytes of weights one step over a batch reads, by part.

    The spec's formula, plus the two small vectors it leaves out: the selection bias
    (N*B) and the shared-expert gate (d*B), which a step reads all the same. Quantized FFN
    weights count their packed codes plus one scale (B bytes) per group.
    """

    departments_used: int  # U_d
    experts_used: int  # U_e
    department_bytes: int
    expert_bytes: int
    router_bytes: int
    shared_expert_bytes: int

    @property
    def total(self) -> int:
        return self.department_bytes + self.expert_bytes + self.router_bytes + self.shared_expert_bytes


def ffn_bytes(numel: int, bytes_per_weight: int, quant: QuantConfig | None = None) -> int:
    """Bytes of numel FFN weights: B each, or packed codes plus scales when quantized."""
    return numel * bytes_per_weight if quant is None else quant.nbytes(numel, bytes_per_weight)


def weights_loaded(
    config: DeaMoEConfig, routing: Routing, bytes_per_weight: int, quant: QuantConfig | None = None
) -> StepTraffic:
    """Bytes one step reads for the batch whose routing is given (FFN weights quantized by quant)."""
    d, b = config.hidden_size, bytes_per_weight
    departments_used = int(routing.used_departments().numel()) if config.shared_intermediate_size else 0
    experts_used = int(routing.used_experts().numel()) if config.private_intermediate_size else 0
    router = config.num_experts * d * b + (config.num_experts * b if config.router_bias else 0)
    shared = ffn_bytes(3 * d * config.shared_expert_intermediate_size, b, quant)
    shared += d * b if config.shared_expert_gate else 0
    return StepTraffic(
        departments_used=departments_used,
        experts_used=experts_used,
        department_bytes=departments_used * ffn_bytes(3 * d * config.shared_intermediate_size, b, quant),
        expert_bytes=experts_used * ffn_bytes(3 * d * config.private_intermediate_size, b, quant),
        router_bytes=router,
        shared_expert_bytes=shared,
    )


def compare_traffic(
    config: DeaMoEConfig,
    logits: torch.Tensor,
    router_bias: torch.Tensor | None,
    bytes_per_weight: int,
    quant: QuantConfig | None = None,
) -> dict[str, StepTraffic]:
    """One batch's bytes for the layer, its expanded twin (same routing, no sharing) and its
    vanilla twin (one-stage top-k over the same scores, no sharing), keyed by those names."""
    routing = route_logits(logits, router_bias, config)
    vanilla = config.vanilla()
    return {
        "deamoe": weights_loaded(config, routing, bytes_per_weight, quant),
        "expanded": weights_loaded(config.expanded(), routing, bytes_per_weight, quant),
        "vanilla": weights_loaded(vanilla, route_logits(logits, router_bias, vanilla), bytes_per_weight, quant),
    }
