"""A DeaMoE layer's tensors as its Edge-LLM node stores them, and back (no Edge-LLM needed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...export import plugin_node
from ...layer import DeaMoELayer


def layer_from_node(weights: Sequence[torch.Tensor], attrs: dict, dtype: torch.dtype) -> DeaMoELayer:
    """The reference layer a node's weight inputs (as they are stored in the node) and attributes describe."""
    config = plugin_node.config_from_attributes(attrs)
    quant = plugin_node.quant_from_attributes(attrs, config)
    router_dtype = weights[0].dtype if weights[0].dtype == torch.float32 else dtype
    layer = DeaMoELayer(config, dtype=dtype, device="meta", router_dtype=router_dtype, quant=quant)
    expected = layer.state_dict()
    state = {}
    for key, tensor in zip(plugin_node.state_keys(config, quant), weights, strict=True):
        if tensor.dtype == torch.int32:  # codes: the checkpoint's bytes as int32 words
            tensor = tensor.contiguous().view(torch.uint8)
        state[key] = tensor.reshape(expected[key].shape).to(expected[key].dtype)
    layer.load_state_dict(state, assign=True)
    return layer


def node_tensors(layer: DeaMoELayer) -> dict[str, torch.Tensor]:
    """The node's weight inputs for layer, by state key, as the node stores them: fp16 FFN
    weights and scales, codes as int32 words, the router in float32 when the layer keeps it so."""
    state = layer.state_dict()
    out = {}
    for key in plugin_node.state_keys(layer.config, layer.quant):
        tensor = state[key].detach()
        if key.endswith(".qweight"):
            tensor = tensor.contiguous().view(torch.int32)
        elif key == "router.bias" or (key == "router.weight" and tensor.dtype == torch.float32):
            tensor = tensor.float()
        else:
            tensor = tensor.to(torch.float16)
        out[key] = tensor.contiguous()
    return out
