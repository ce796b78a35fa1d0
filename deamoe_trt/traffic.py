"""Weights loaded per decoding step: the metric the project exists for (spec, "Weights loaded per step")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DeaMoEConfig
from .dtypes import DTYPES
from .quant import QuantConfig
from .routing import Routing, route_logits

BYTES_PER_WEIGHT = {d.torch: d.bytes for d in DTYPES}


@dataclass(frozen=True)
class StepTraffic:
    """Bytes of weights one step over a batch reads, by part.

    The spec's formula, plus the two small vectors it leaves out: the selection bias
    (N*4, always float32) and the shared-expert gate (d*B), which a step reads all the same.
    The router weight counts at its own precision (N*d*B_router), its logit bias (N*4)
    with it. Quantized FFN weights count their packed codes plus one scale (B bytes) per
    group; each part's biases count with its weights, B bytes each (never quantized).
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


def _router_vectors(config: DeaMoEConfig) -> int:
    """Entries of the router's float32 vectors: the selection bias and the logit bias."""
    return config.num_experts * (int(config.router_bias) + int(config.router_logit_bias))


def _router_weights(config: DeaMoEConfig) -> int:
    return config.num_experts * config.hidden_size + _router_vectors(config)


def router_bytes(config: DeaMoEConfig, bytes_per_weight: int) -> int:
    """The router's bytes: its weight at bytes_per_weight each, its selection and logit biases
    float32 (spec, "Router precision" and "Router logit bias")."""
    vectors = _router_vectors(config) * BYTES_PER_WEIGHT[torch.float32]
    return config.num_experts * config.hidden_size * bytes_per_weight + vectors


def _department_weights(config: DeaMoEConfig) -> int:
    return 3 * config.hidden_size * config.shared_intermediate_size


def _expert_weights(config: DeaMoEConfig) -> int:
    return 3 * config.hidden_size * config.private_intermediate_size


def _shared_expert_weights(config: DeaMoEConfig) -> int:
    return 3 * config.hidden_size * config.shared_expert_intermediate_size


def _shared_gate_weights(config: DeaMoEConfig) -> int:
    return config.hidden_size if config.shared_expert_gate else 0


# Biases of each part (spec, "Biased experts"): gate/up biases 2*width, down biases d for the
# experts and shared experts (departments have none). Never quantized: B bytes each.


def _department_biases(config: DeaMoEConfig) -> int:
    return 2 * config.shared_intermediate_size if config.ffn_bias else 0


def _expert_biases(config: DeaMoEConfig) -> int:
    return 2 * config.private_intermediate_size + config.hidden_size if config.ffn_bias else 0


def _shared_expert_biases(config: DeaMoEConfig) -> int:
    if not (config.ffn_bias and config.has_shared_experts):
        return 0
    return 2 * config.shared_expert_intermediate_size + config.hidden_size


def parameter_count(config: DeaMoEConfig) -> int:
    """Weights of one layer (every canonical tensor), without allocating it."""
    return (
        _router_weights(config)
        + config.num_departments * (_department_weights(config) + _department_biases(config))
        + config.num_experts * (_expert_weights(config) + _expert_biases(config))
        + _shared_expert_weights(config)
        + _shared_expert_biases(config)
        + _shared_gate_weights(config)
    )


def ffn_bytes(numel: int, bytes_per_weight: int, quant: QuantConfig | None = None, biases: int = 0) -> int:
    """Bytes of numel FFN weights (B each, or packed codes plus scales when quantized) and
    their part's biases (B each, never quantized)."""
    weights = numel * bytes_per_weight if quant is None else quant.nbytes(numel, bytes_per_weight)
    return weights + biases * bytes_per_weight


def _department_bytes(config: DeaMoEConfig, b: int, quant: QuantConfig | None) -> int:
    return ffn_bytes(_department_weights(config), b, quant, _department_biases(config))


def _expert_bytes(config: DeaMoEConfig, b: int, quant: QuantConfig | None) -> int:
    return ffn_bytes(_expert_weights(config), b, quant, _expert_biases(config))


def _shared_expert_bytes(config: DeaMoEConfig, b: int, quant: QuantConfig | None) -> int:
    return ffn_bytes(_shared_expert_weights(config), b, quant, _shared_expert_biases(config))


def stored_bytes(config: DeaMoEConfig, bytes_per_weight: int, quant: QuantConfig | None = None) -> int:
    """One layer's stored bytes: FFN weights (packed codes plus scales when quantized), the
    router weight and the shared-expert gate at B each, the selection bias in float32."""
    b = bytes_per_weight
    ffn = config.num_departments * _department_bytes(config, b, quant)
    ffn += config.num_experts * _expert_bytes(config, b, quant)
    ffn += _shared_expert_bytes(config, b, quant)
    return ffn + router_bytes(config, b) + _shared_gate_weights(config) * b


def layer_bytes(config: DeaMoEConfig, dtype: torch.dtype) -> int:
    """Bytes of one layer's weights in dtype."""
    return stored_bytes(config, BYTES_PER_WEIGHT[dtype])


def weights_loaded(
    config: DeaMoEConfig,
    routing: Routing,
    bytes_per_weight: int,
    quant: QuantConfig | None = None,
    router_bytes_per_weight: int | None = None,
) -> StepTraffic:
    """Bytes one step reads for the batch whose routing is given (FFN weights quantized by quant).

    bytes_per_weight: of the FFN weights; router_bytes_per_weight: of the router weight,
    which is never quantized (default the same as the FFN weights')."""
    b = bytes_per_weight
    rb = b if router_bytes_per_weight is None else router_bytes_per_weight
    departments_used = int(routing.used_departments().numel()) if config.shared_intermediate_size else 0
    experts_used = int(routing.used_experts().numel()) if config.private_intermediate_size else 0
    shared = _shared_expert_bytes(config, b, quant) + _shared_gate_weights(config) * b
    return StepTraffic(
        departments_used=departments_used,
        experts_used=experts_used,
        department_bytes=departments_used * _department_bytes(config, b, quant),
        expert_bytes=experts_used * _expert_bytes(config, b, quant),
        router_bytes=router_bytes(config, rb),
        shared_expert_bytes=shared,
    )


def compare_traffic(
    config: DeaMoEConfig,
    logits: torch.Tensor,
    router_bias: torch.Tensor | None,
    bytes_per_weight: int,
    quant: QuantConfig | None = None,
    router_bytes_per_weight: int | None = None,
) -> dict[str, StepTraffic]:
    """One batch's bytes for the layer, its expanded twin (same routing, no sharing) and its
    vanilla twin (one-stage top-k over the same scores, no sharing), keyed by those names."""
    routing = route_logits(logits, router_bias, config)
    vanilla = config.vanilla()
    b, rb = bytes_per_weight, router_bytes_per_weight
    return {
        "deamoe": weights_loaded(config, routing, b, quant, rb),
        "expanded": weights_loaded(config.expanded(), routing, b, quant, rb),
        "vanilla": weights_loaded(vanilla, route_logits(logits, router_bias, vanilla), b, quant, rb),
    }
