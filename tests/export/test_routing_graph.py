"""The routing written in ONNX ops picks what deamoe_trt.routing picks, ties included."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from deamoe_trt import route
from deamoe_trt.export import GraphBuilder
from deamoe_trt.export.routing_graph import emit_routing
from deamoe_trt.inputs import random_hidden

from .conftest import CONFIGS, layer_of


def _routing_session(layer):
    b = GraphBuilder()
    x = b.add_input("x", ["T", layer.config.hidden_size])
    weights = {name: b.weight(name, t) for name, t in layer.state_dict().items() if name.startswith("router.")}
    r = emit_routing(b, x, weights, layer.config)
    for value, elem in ((r.expert_ids, TensorProto.INT64), (r.weights, TensorProto.FLOAT)):
        b.add_output(value, None, elem)
    b.add_output(r.department_weights, None, TensorProto.FLOAT)
    return ort.InferenceSession(b.build("routing").SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_ids_and_weights_match_routing_py_with_exact_ties(config_name):
    layer = layer_of(CONFIGS[config_name], seed=4)
    with torch.no_grad():
        # Repeat router rows: equal logits, so equal scores, in and across departments.
        w = layer.router.weight
        w[1] = w[0]
        w[5] = w[0]
        w[-1] = w[2]
        if layer.router.bias is not None:
            layer.router.bias.zero_()
    session = _routing_session(layer)
    x = random_hidden(64, layer.config.hidden_size, seed=9)
    ids, weights, department_weights = session.run(None, {"x": x.numpy()})
    with torch.no_grad():
        expected = route(x, layer.router.weight, layer.router.bias, layer.config)
    np.testing.assert_array_equal(ids, expected.expert_ids.numpy())
    np.testing.assert_allclose(weights, expected.weights.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        department_weights, expected.department_weights(layer.config.num_departments).numpy(), rtol=1e-6, atol=1e-7
    )


def test_onnx_topk_on_onnxruntime_puts_equal_values_lower_index_first():
    node = helper.make_node("TopK", ["v", "k"], ["values", "indices"], axis=1)
    graph = helper.make_graph(
        [node],
        "topk",
        [
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("indices", TensorProto.INT64, None),
        ],
    )
    session = ort.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    v = np.array([[1, 3, 3, 0, 3, -np.inf, -np.inf], [-np.inf] * 7], np.float32)
    _, indices = session.run(None, {"v": v, "k": np.array([6])})
    np.testing.assert_array_equal(indices, [[1, 2, 4, 0, 3, 5], [0, 1, 2, 3, 4, 5]])
