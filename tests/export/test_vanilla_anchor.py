"""A plain vanilla MoE exports to the ort form as ONNX Runtime's own com.microsoft.MoE routing."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from deamoe_trt.export import build_model, export_info
from deamoe_trt.validation import make_session

from .conftest import CONFIGS, TOKENS, TOLERANCE, layer_of, max_error


def _vanilla(config_name, dtype, **changes):
    layer = layer_of(CONFIGS[config_name].replace(**changes), "fp32", seed=5).vanilla()
    return layer.to(layer_of(CONFIGS["tiny"], dtype).dtype)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_vanilla_layer_is_one_moe_node_on_its_own_routing_and_matches_reference(dtype, norm_topk_prob):
    layer = _vanilla("tiny", dtype, norm_topk_prob=norm_topk_prob)
    model = build_model(layer, "ort", dtype)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MoE") == 1 and "TopK" not in ops and "Softmax" not in ops
    (moe,) = [n for n in model.graph.node if n.op_type == "MoE"]
    attrs = {a.name: helper.get_attribute_value(a) for a in moe.attribute}
    assert attrs["k"] == layer.config.top_k
    assert attrs["normalize_routing_weights"] == int(norm_topk_prob)
    assert export_info(model).ort_routing == "moe-op"
    session = make_session(model)
    assert max(max_error(session, layer, t, seed=t) for t in (*TOKENS, 64)) <= TOLERANCE[dtype]


def test_vanilla_anchor_keeps_a_gated_shared_expert_as_gemms():
    layer = _vanilla("tiny", "fp32", shared_expert_intermediate_size=32, shared_expert_gate=True)
    model = build_model(layer, "ort")
    assert [n.op_type for n in model.graph.node].count("MoE") == 1
    assert max_error(make_session(model), layer, 17) <= TOLERANCE["fp32"]


def test_deamoe_layer_uses_two_moe_nodes_on_graph_routing():
    model = build_model(layer_of(CONFIGS["tiny"]), "ort")
    assert [n.op_type for n in model.graph.node].count("MoE") == 2
    assert export_info(model).ort_routing == "graph"


def test_moe_attributes_exist_in_the_running_onnxruntime_schema():
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    (schema,) = [s for s in C.get_all_operator_schema() if (s.name, s.domain) == ("MoE", "com.microsoft")]
    model = build_model(layer_of(CONFIGS["deepseek-style"]), "ort")
    for node in model.graph.node:
        if node.op_type == "MoE":
            assert {a.name for a in node.attribute} <= set(schema.attributes)
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["activation_alpha"] == 1.0 and attrs["activation_beta"] == 0.0
            assert attrs["swiglu_limit"] == float("inf") and attrs["swiglu_fusion"] == 1
    onnx.checker.check_model(model)
