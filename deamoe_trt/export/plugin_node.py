"""The plugin ONNX node's contract (plugins/deamoe/README.md) and its attribute <-> config round trip.

This module is the one place that knows how a DeaMoEConfig becomes node attributes and back,
and which inputs a node of a given config has: the plugin form writes nodes with it, the
ONNX Runtime reference op reads them with it, and validation checks them with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper

from .. import contract
from ..config import OPTIONAL_FIELDS, DeaMoEConfig
from ..errors import UsageError
from ..quant import QuantConfig

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


# Attributes a node may lack, with the value it then has: the quantization's (0, a float
# node) and the config fields that JSON leaves out at their defaults (gpt-oss's extensions:
# the layer without them). Nodes written before these attributes existed read as before.
_DEFAULTS: dict[str, Any] = {
    **{a.name: 0 for a in contract.QUANT_ATTRIBUTES},
    **{f.name: f.default for f in dataclasses.fields(DeaMoEConfig) if f.name in OPTIONAL_FIELDS},
}
_OPTIONAL = set(_DEFAULTS)
_QUANT = {a.name for a in contract.QUANT_ATTRIBUTES}


def weight_inputs(config: DeaMoEConfig, quant: QuantConfig | None = None) -> list[str]:
    """Canonical names of the weight inputs a node of config (and quant) has, in input order."""
    return [item.name for item in contract.present_inputs(config, quant)[1:]]


def state_key(item: contract.Input, quant: QuantConfig | None) -> str:
    """The DeaMoELayer state_dict key of the tensor that input item carries: a quantized
    node's codes inputs carry "<weight>.qweight" (its other inputs are named as their keys)."""
    return f"{item.name}.qweight" if contract.dtype_of(item, quant) == contract.CODES_DTYPE else item.name


def state_keys(config: DeaMoEConfig, quant: QuantConfig | None = None) -> list[str]:
    """state_key of each weight input a node of config (and quant) has, in input order."""
    return [state_key(item, quant) for item in contract.present_inputs(config, quant)[1:]]


def config_to_attributes(config: DeaMoEConfig, quant: QuantConfig | None = None) -> dict[str, Any]:
    """The node's attributes: one per contract attribute (bools as 0/1), plus
    plugin_version/namespace. A float node leaves out the quantization's (0 by default), and
    every node the optional config fields that its config's JSON leaves out (at their
    defaults), so exports of layers without them are what they were before they existed."""
    attrs: dict[str, Any] = {}
    written = config.to_dict()
    for name, value in contract.attribute_values(config, quant).items():
        if name in _OPTIONAL and (quant is None if name in _QUANT else name not in written):
            continue
        attrs[name] = int(value) if isinstance(value, bool) else value
    attrs["plugin_version"] = PLUGIN_VERSION
    attrs["plugin_namespace"] = PLUGIN_NAMESPACE
    return attrs


def quant_from_attributes(
    attrs: Mapping[str, Any], config: DeaMoEConfig, *, where: str = "DeaMoE node"
) -> QuantConfig | None:
    """The QuantConfig a node's weight_bits/weight_group_size describe (None: float weights),
    checked as the plugin checks it; one-line UsageError otherwise."""
    bits, group_size = attrs.get(contract.WEIGHT_BITS, 0), attrs.get(contract.WEIGHT_GROUP_SIZE, 0)
    if bits == 0:
        if group_size != 0:
            raise UsageError(f"{where}: weight_group_size is {group_size} but weight_bits is 0; it must be 0")
        return None
    try:
        quant = QuantConfig(bits, group_size)
        for attribute in contract.CONFIG_ATTRIBUTES:
            if attribute.symbol in ("d", "f_s", "f_p", "f_sh") and getattr(config, attribute.name):
                quant.check_width(f"{attribute.name} ({attribute.symbol})", getattr(config, attribute.name))
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return quant


def config_from_attributes(attrs: Mapping[str, Any], *, where: str = "DeaMoE node") -> DeaMoEConfig:
    """The config a node's attributes (name -> Python value) describe; one-line UsageError otherwise."""
    missing = sorted(set(ATTRIBUTE_TYPES) - set(attrs) - _OPTIONAL)
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
    for attribute in contract.CONFIG_ATTRIBUTES:
        name = attribute.name
        if name not in attrs:
            continue  # an optional attribute: DeaMoEConfig's default
        value = attrs[name]
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


def add_default_attributes(node: onnx.NodeProto) -> None:
    """Give node the optional attributes it lacks, at their defaults (0: float weights; the
    config's defaults), for consumers that declare every attribute (a QDP, the ONNX Runtime
    reference op)."""
    named = {attr.name for attr in node.attribute}
    node.attribute.extend(
        helper.make_attribute(name, int(value) if isinstance(value, bool) else value)
        for name, value in sorted(_DEFAULTS.items())
        if name not in named
    )


def node_layer(node: onnx.NodeProto) -> tuple[DeaMoEConfig, QuantConfig | None]:
    """The config and quantization (None: float) of a DeaMoE node, with its input count
    checked against them."""
    if (node.op_type, node.domain) != (OP_TYPE, DOMAIN):
        raise UsageError(f"node {node.name!r} is {node.domain or 'ai.onnx'}::{node.op_type}, not {DOMAIN}::{OP_TYPE}")
    where = f"DeaMoE node {node.name!r}"
    attrs = node_attributes(node)
    config = config_from_attributes(attrs, where=where)
    quant = quant_from_attributes(attrs, config, where=where)
    names = weight_inputs(config, quant)
    if len(node.input) != 1 + len(names) or "" in node.input:
        raise UsageError(
            f"DeaMoE node {node.name!r} has {len(node.input)} input(s) but its attributes call for "
            f"{1 + len(names)}: hidden_states, {', '.join(names)}"
        )
    return config, quant


def config_from_node(node: onnx.NodeProto) -> DeaMoEConfig:
    """The config of a DeaMoE node (node_layer's first half)."""
    return node_layer(node)[0]


def same_config(a: DeaMoEConfig, b: DeaMoEConfig) -> bool:
    """Equal as a node can say it: float attributes (routed_scaling_factor, swiglu_alpha,
    swiglu_limit) travel as float32."""
    return as_float32(a) == as_float32(b)


def as_float32(config: DeaMoEConfig) -> DeaMoEConfig:
    """config as a node gives it back: the float attributes it writes rounded to float32 (one
    it leaves out reads as DeaMoEConfig's default, exactly)."""
    written = config.to_dict()
    floats = (a.name for a in contract.CONFIG_ATTRIBUTES if a.kind == "float" and a.name in written)
    return config.replace(**{name: float(np.float32(getattr(config, name))) for name in floats})
