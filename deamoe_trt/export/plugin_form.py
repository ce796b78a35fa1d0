"""The `plugin` form: each layer as the one DeaMoE node of plugins/deamoe/README.md."""

from __future__ import annotations

from ..config import DeaMoEConfig
from . import plugin_node
from .graph import GraphBuilder


def emit(b: GraphBuilder, x: str, weights: dict[str, str], config: DeaMoEConfig) -> str:
    """One node: hidden_states then the present weight inputs in contract order, config as attributes."""
    inputs = [x] + [weights[name] for name in plugin_node.weight_inputs(config)]
    return b.op(
        plugin_node.OP_TYPE,
        inputs,
        domain=plugin_node.DOMAIN,
        name=plugin_node.OP_TYPE,
        **plugin_node.config_to_attributes(config),
    )
