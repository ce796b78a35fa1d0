"""Weights loaded per decoding step: the metric the project exists for (spec, "Weights loaded per step")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DeaMoEConfig
from .dtypes import DTYPES
from .routing import Routing, route_logits

BYTES_PER_WEIGHT = {d.torch: d.bytes for d in DTYPES}


@dataclass(frozen=True)
class StepTraffic:
    """Bytes of weights one step over a batch reads, by part.

    The spec's formula, plus the two small vectors it leaves out: the selection bias
    (N*B) and the shared-expert gate (d*B), which a step reads all the same.
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


# Weights of each part of a layer: gate, up and down of a SwiGLU block are 3*d*width.


def _router_weights(config: DeaMoEConfig) -> int:
    return config.num_experts * config.hidden_size + (config.num_experts if config.router_bias else 0)


def _shared_expert_weights(config: DeaMoEConfig) -> int:
    d = config.hidden_size
    return 3 * d * config.shared_expert_intermediate_size + (d if config.shared_expert_gate else 0)


def _department_weights(config: DeaMoEConfig) -> int:
    return 3 * config.hidden_size * config.shared_intermediate_size


def _expert_weights(config: DeaMoEConfig) -> int:
    return 3 * config.hidden_size * config.private_intermediate_size


def parameter_count(config: DeaMoEConfig) -> int:
    """Weights of one layer (every canonical tensor), without allocating it."""
    return (
        _router_weights(config)
        + config.num_departments * _department_weights(config)
        + config.num_experts * _expert_weights(config)
        + _shared_expert_weights(config)
    )


def layer_bytes(config: DeaMoEConfig, dtype: torch.dtype) -> int:
    """Bytes of one layer's weights in dtype."""
    return parameter_count(config) * BYTES_PER_WEIGHT[dtype]


def weights_loaded(config: DeaMoEConfig, routing: Routing, bytes_per_weight: int) -> StepTraffic:
    """Bytes one step reads for the batch whose routing is given."""
    b = bytes_per_weight
    departments_used = int(routing.used_departments().numel()) if config.shared_intermediate_size else 0
    experts_used = int(routing.used_experts().numel()) if config.private_intermediate_size else 0
    return StepTraffic(
        departments_used=departments_used,
        experts_used=experts_used,
        department_bytes=departments_used * _department_weights(config) * b,
        expert_bytes=experts_used * _expert_weights(config) * b,
        router_bytes=_router_weights(config) * b,
        shared_expert_bytes=_shared_expert_weights(config) * b,
    )


def compare_traffic(
    config: DeaMoEConfig, logits: torch.Tensor, router_bias: torch.Tensor | None, bytes_per_weight: int
) -> dict[str, StepTraffic]:
    """One batch's bytes for the layer, its expanded twin (same routing, no sharing) and its
    vanilla twin (one-stage top-k over the same scores, no sharing), keyed by those names."""
    routing = route_logits(logits, router_bias, config)
    vanilla = config.vanilla()
    return {
        "deamoe": weights_loaded(config, routing, bytes_per_weight),
        "expanded": weights_loaded(config.expanded(), routing, bytes_per_weight),
        "vanilla": weights_loaded(vanilla, route_logits(logits, router_bias, vanilla), bytes_per_weight),
    }
