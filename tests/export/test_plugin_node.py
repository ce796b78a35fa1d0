"""The plugin form's node is exactly the contract of plugins/deamoe/README.md, and its attributes
round-trip to the config."""

from __future__ import annotations

import dataclasses
import re

import pytest
from onnx import AttributeProto, helper

from deamoe_trt import DeaMoEConfig, DeaMoEStack, UsageError
from deamoe_trt.export import build_model
from deamoe_trt.export.plugin_node import (
    config_from_attributes,
    config_from_node,
    config_to_attributes,
    node_layer,
    quant_from_attributes,
    same_config,
    weight_inputs,
)

from .conftest import CONFIGS, DEEPSEEK_STYLE, layer_of

# The contract's table, restated here so the test is an independent expectation.
CONTRACT_TYPES = {
    "hidden_size": AttributeProto.INT,
    "num_departments": AttributeProto.INT,
    "experts_per_department": AttributeProto.INT,
    "shared_intermediate_size": AttributeProto.INT,
    "private_intermediate_size": AttributeProto.INT,
    "top_k": AttributeProto.INT,
    "top_departments": AttributeProto.INT,
    "score_func": AttributeProto.STRING,
    "department_score": AttributeProto.STRING,
    "norm_topk_prob": AttributeProto.INT,
    "routed_scaling_factor": AttributeProto.FLOAT,
    "router_bias": AttributeProto.INT,
    "shared_expert_intermediate_size": AttributeProto.INT,
    "shared_expert_gate": AttributeProto.INT,
    "plugin_version": AttributeProto.STRING,
    "plugin_namespace": AttributeProto.STRING,
}
CANONICAL_ORDER = [
    "router.weight",
    "router.bias",
    "departments.gate_up",
    "departments.down",
    "experts.gate_up",
    "experts.down",
    "shared_experts.gate_up",
    "shared_experts.down",
    "shared_experts.gate",
]

VARIANTS = {
    **CONFIGS,
    "no-shared-part": CONFIGS["tiny"].replace(shared_intermediate_size=0),
    "no-private-part": CONFIGS["tiny"].replace(private_intermediate_size=0),
    "odd-scaling": DEEPSEEK_STYLE.replace(routed_scaling_factor=2.827),  # not a float32 value
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_node_has_contract_op_inputs_in_canonical_order_and_typed_attributes(name):
    config = VARIANTS[name]
    layer = layer_of(config)
    model = build_model(layer, "plugin")
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("DeaMoE", "deamoe_trt")
    present = list(layer.state_dict())
    assert list(node.input) == ["hidden_states"] + [n for n in CANONICAL_ORDER if n in present]
    assert list(node.output) == ["output"]
    assert {a.name: a.type for a in node.attribute} == CONTRACT_TYPES
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["plugin_version"] == b"1" and attrs["plugin_namespace"] == b""
    assert {t.name for t in model.graph.initializer} == set(present)
    assert any(i.domain == "deamoe_trt" and i.version == 1 for i in model.opset_import)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_attributes_round_trip_to_the_config(name):
    config = VARIANTS[name]
    (node,) = build_model(layer_of(config), "plugin").graph.node
    back = config_from_node(node)
    assert same_config(back, config)
    assert config_from_attributes(config_to_attributes(config)) == config
    for field in dataclasses.fields(DeaMoEConfig):
        if field.name != "routed_scaling_factor":
            assert getattr(back, field.name) == getattr(config, field.name), field.name
    assert back.routed_scaling_factor == pytest.approx(config.routed_scaling_factor, rel=1e-7)


def test_stack_has_one_node_per_layer_with_prefixed_weights():
    model = build_model(DeaMoEStack.random(CONFIGS["tiny"], 2), "plugin", layer_indices=[3, 5])
    nodes = [n for n in model.graph.node if n.op_type == "DeaMoE"]
    assert [n.input[1] for n in nodes] == ["layers.3.router.weight", "layers.5.router.weight"]


def test_weight_inputs_follow_presence_rules():
    assert weight_inputs(CONFIGS["tiny"]) == ["router.weight", *CANONICAL_ORDER[2:6]]
    assert weight_inputs(DEEPSEEK_STYLE) == CANONICAL_ORDER[:8]
    assert weight_inputs(CONFIGS["qwen2-style"])[-1] == "shared_experts.gate"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.pop("top_k"), "lacks attribute(s) top_k"),
        (lambda a: a.update(colour="blue"), "unknown attribute(s) colour"),
        (lambda a: a.update(plugin_version="2"), "plugin_version '2'"),
        (lambda a: a.update(norm_topk_prob=2), "norm_topk_prob must be 0 or 1"),
        (lambda a: a.update(top_k=99), "top_k must be <="),
    ],
)
def test_bad_attributes_are_one_line_usage_errors(change, message):
    attrs = config_to_attributes(CONFIGS["tiny"])
    change(attrs)
    with pytest.raises(UsageError, match=re.escape(message)):
        config_from_attributes(attrs)


def test_node_with_wrong_input_count_or_attribute_type_is_rejected():
    (node,) = build_model(layer_of(CONFIGS["tiny"]), "plugin").graph.node
    short = helper.make_node("DeaMoE", list(node.input)[:-1], ["y"], domain="deamoe_trt")
    short.attribute.extend(node.attribute)
    with pytest.raises(UsageError, match="has 5 input"):
        config_from_node(short)
    wrong = helper.make_node("DeaMoE", list(node.input), ["y"], domain="deamoe_trt")
    wrong.attribute.extend(a for a in node.attribute if a.name != "top_k")
    wrong.attribute.append(helper.make_attribute("top_k", 4.0))
    with pytest.raises(UsageError, match="top_k is FLOAT, the contract says INT"):
        config_from_node(wrong)


# --- quantized nodes -------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_node_round_trips_its_quantization(bits):
    from deamoe_trt.quant import QuantConfig

    quant = QuantConfig(bits, 16)
    (node,) = build_model(layer_of(CONFIGS["qwen2-style"]).quantized(quant), "plugin").graph.node
    config, back = node_layer(node)
    assert same_config(config, CONFIGS["qwen2-style"]) and back == quant
    assert {a.name: a.type for a in node.attribute} == {
        **CONTRACT_TYPES,
        "weight_bits": AttributeProto.INT,
        "weight_group_size": AttributeProto.INT,
    }
    # Codes in the weights' positions, under the checkpoint's names; scales appended.
    weights = [n for n in CANONICAL_ORDER if n in weight_inputs(CONFIGS["qwen2-style"])]
    codes = {"departments.gate_up", "departments.down", "experts.gate_up", "experts.down"}
    codes |= {"shared_experts.gate_up", "shared_experts.down"}
    assert list(node.input[1:]) == [f"{n}.qweight" if n in codes else n for n in weights] + [
        f"{n}.scales" for n in CANONICAL_ORDER if n in codes
    ]


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"weight_bits": 3, "weight_group_size": 16}, "unsupported bits 3"),
        ({"weight_bits": 4, "weight_group_size": 48}, "unsupported group size 48"),
        ({"weight_bits": 4, "weight_group_size": 128}, "hidden_size (d) is 64, not divisible by the group size 128"),
        ({"weight_bits": 0, "weight_group_size": 16}, "weight_group_size is 16 but weight_bits is 0"),
    ],
)
def test_bad_quantization_attributes_are_one_line_usage_errors(quantization, message):
    attrs = config_to_attributes(CONFIGS["tiny"]) | quantization
    with pytest.raises(UsageError, match=re.escape(message)):
        quant_from_attributes(attrs, config_from_attributes(attrs), where="DeaMoE node 'x'")
