"""The `plugin` form: each layer as the one DeaMoE node of plugins/deamoe/README.md.

A quantized checkpoint's node carries the checkpoint's bytes unchanged: each FFN weight's
codes ("<weight>.qweight", uint8) as int32 words of 4 code bytes (contract.CODES_DTYPE,
little-endian: the same bytes), its scales ("<weight>.scales") in the export dtype, and
weight_bits/weight_group_size as attributes.
"""

from __future__ import annotations

from onnx import TensorProto

from .. import contract
from ..config import DeaMoEConfig
from ..quant import QuantConfig
from . import plugin_node
from .graph import GraphBuilder

# contract.CODES_DTYPE as an ONNX element type, and the bytes of one element.
CODE_TYPE = TensorProto.INT32
CODE_WORD_BYTES = contract.CODE_WORD_BITS // 8


def code_type(bits: int) -> int:
    """The element type of a codes initializer (int32 words whatever the bits)."""
    return CODE_TYPE


def emit(
    b: GraphBuilder, x: str, weights: dict[str, str], config: DeaMoEConfig, quant: QuantConfig | None = None
) -> str:
    """One node: hidden_states then the present weight inputs in contract order (by their
    checkpoint tensors' names), config and quant as attributes."""
    inputs = [x] + [weights[name] for name in plugin_node.state_keys(config, quant)]
    return b.op(
        plugin_node.OP_TYPE,
        inputs,
        domain=plugin_node.DOMAIN,
        name=plugin_node.OP_TYPE,
        **plugin_node.config_to_attributes(config, quant),
    )
