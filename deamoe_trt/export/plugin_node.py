"""The plugin ONNX node's contract (plugins/deamoe/README.md) and its attribute <-> config round trip.

This module is the one place that knows how a DeaMoEConfig becomes node attributes and back,
and which inputs a node of a given config has: the plugin form writes nodes with it, the
ONNX Runtime reference op reads them with it, and validation checks them with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper

from .. import contract
from ..config import DeaMoEConfig
from ..errors import UsageError

# The contract itself lives in deamoe_trt.contract; these names are the export's view of it.
OP_TYPE = contract.OP_TYPE
DOMAIN = contract.DOMAIN
PLUGIN_VERSION = contract.PLUGIN_VERSION
PLUGIN_NAMESPACE = contract.PLUGIN_NAMESPACE
OUTPUT_NAME = contract.OUTPUT_NAME
MAX_INPUTS = contract.MAX_INPUTS

# Attribute kind -> ONNX attribute type (bools travel as INT 0/1).
_ONNX_TYPE = {
    "int": AttributeProto.INT,
    "bool": AttributeProto.INT,
    "float": AttributeProto.FLOAT,
    "str": AttributeProto.STRING,
}
ATTRIBUTE_TYPES: dict[str, int] = {
    **{a.name: _ONNX_TYPE[a.kind] for a in contract.ATTRIBUTES},
    **dict.fromkeys(contract.SELECTOR_ATTRIBUTES, AttributeProto.STRING),
}


def weight_inputs(config: DeaMoEConfig) -> list[str]:
    """Canonical names of the weight inputs a node of config has, in input order."""
    return [item.name for item in contract.present_inputs(config)[1:]]


def config_to_attributes(config: DeaMoEConfig) -> dict[str, Any]:
    """The node's attributes: one per config field (bools as 0/1), plus plugin_version/namespace."""
    attrs: dict[str, Any] = {}
    for name, value in config.to_dict().items():
        attrs[name] = int(value) if isinstance(value, bool) else value
    attrs["plugin_version"] = PLUGIN_VERSION
    attrs["plugin_namespace"] = PLUGIN_NAMESPACE
    return attrs


def config_from_attributes(attrs: Mapping[str, Any], *, where: str = "DeaMoE node") -> DeaMoEConfig:
    """The config a node's attributes (name -> Python value) describe; one-line UsageError otherwise."""
    missing = sorted(set(ATTRIBUTE_TYPES) - set(attrs))
    if missing:
        raise UsageError(f"{where} lacks attribute(s) {', '.join(missing)}")
    unknown = sorted(set(attrs) - set(ATTRIBUTE_TYPES))
    if unknown:
        raise UsageError(f"{where} has unknown attribute(s) {', '.join(unknown)}")
    if attrs["plugin_version"] != PLUGIN_VERSION:
        raise UsageError(
            f"{where} has plugin_version {attrs['plugin_version']!r}; this deamoe-trt reads {PLUGIN_VERSION!r}"
        )
    if attrs["plugin_namespace"] != PLUGIN_NAMESPACE:
        raise UsageError(f"{where} has plugin_namespace {attrs['plugin_namespace']!r}; expected {PLUGIN_NAMESPACE!r}")
    fields: dict[str, Any] = {}
    for attribute in contract.ATTRIBUTES:
        name, value = attribute.name, attrs[attribute.name]
        if attribute.kind == "bool":
            if value not in (0, 1):
                raise UsageError(f"{where}: attribute {name} must be 0 or 1, got {value!r}")
            value = bool(value)
        fields[name] = value
    try:
        return DeaMoEConfig.from_dict(fields)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values, each checked against the type the contract gives it."""
    values: dict[str, Any] = {}
    for attr in node.attribute:
        want = ATTRIBUTE_TYPES.get(attr.name)
        if want is not None and attr.type != want:
            raise UsageError(
                f"DeaMoE node {node.name!r}: attribute {attr.name} is "
                f"{AttributeProto.AttributeType.Name(attr.type)}, the contract says "
                f"{AttributeProto.AttributeType.Name(want)}"
            )
        value = helper.get_attribute_value(attr)
        values[attr.name] = value.decode() if isinstance(value, bytes) else value
    return values


def config_from_node(node: onnx.NodeProto) -> DeaMoEConfig:
    """The config of a DeaMoE node, with its input count checked against that config."""
    if (node.op_type, node.domain) != (OP_TYPE, DOMAIN):
        raise UsageError(f"node {node.name!r} is {node.domain or 'ai.onnx'}::{node.op_type}, not {DOMAIN}::{OP_TYPE}")
    config = config_from_attributes(node_attributes(node), where=f"DeaMoE node {node.name!r}")
    expected = 1 + len(weight_inputs(config))
    if len(node.input) != expected or "" in node.input:
        raise UsageError(
            f"DeaMoE node {node.name!r} has {len(node.input)} input(s) but its attributes call for {expected}: "
            f"hidden_states, {', '.join(weight_inputs(config))}"
        )
    return config


def same_config(a: DeaMoEConfig, b: DeaMoEConfig) -> bool:
    """Equal as a node can say it: routed_scaling_factor travels as float32."""
    return as_float32(a) == as_float32(b)


def as_float32(config: DeaMoEConfig) -> DeaMoEConfig:
    return config.replace(routed_scaling_factor=float(np.float32(config.routed_scaling_factor)))
