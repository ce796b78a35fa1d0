"""GraphBuilder: how other exports (e.g. a whole decoder) put DeaMoE layers inside their graphs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from deamoe_trt import UsageError
from deamoe_trt.export import GraphBuilder, emit_layer
from deamoe_trt.inputs import random_hidden
from deamoe_trt.validation import make_session

from .conftest import CONFIGS, layer_of


@pytest.mark.slow
@pytest.mark.parametrize("form", ["plugin", "ort", "onnx"])
def test_emit_layer_puts_layers_inside_a_larger_graph(form):
    """A decoder-like graph: [B, S, d] in, scale, flatten, two DeaMoE layers with residuals, unflatten."""
    config = CONFIGS["tiny"]
    d = config.hidden_size
    first, second = layer_of(config, seed=1), layer_of(config, seed=2)
    b = GraphBuilder(opset=18, dtype="fp32")
    x = b.add_input("x", ["B", "S", d])
    h = b.op("Mul", [x, b.scalar(0.5)])
    flat = b.reshape(h, [-1, d])
    y1 = b.op("Add", [flat, emit_layer(b, flat, first, form, prefix="model.layers.0.mlp.")])
    y2 = b.op("Add", [y1, emit_layer(b, y1, second, form, prefix="model.layers.1.mlp.")])
    out = b.op("Reshape", [y2, b.op("Shape", [x])])
    b.add_output(out, ["B", "S", d], name="y")
    model = b.build("decoder", metadata={"made_by": "test"})
    onnx.checker.check_model(model)
    assert "model.layers.1.mlp.router.weight" in {t.name for t in model.graph.initializer}

    x_value = random_hidden(6, d, seed=3).reshape(2, 3, d)
    (y,) = make_session(model).run(None, {"x": x_value.numpy()})
    with torch.no_grad():
        flat_x = 0.5 * x_value.reshape(-1, d)
        h1 = flat_x + first(flat_x)
        expected = (h1 + second(h1)).reshape(2, 3, d)
    np.testing.assert_allclose(y, expected.numpy(), atol=1e-5)


def test_names_are_unique_and_scoped_and_reused_prefixes_are_errors():
    b = GraphBuilder()
    x = b.add_input("x", [2])
    with b.scope("a."):
        first = b.op("Relu", [x])
        second = b.op("Relu", [x])
    assert first.startswith("a.") and first != second
    assert b.const([1.0], TensorProto.FLOAT) == b.const([1.0], TensorProto.FLOAT)
    layer = layer_of(CONFIGS["tiny"])
    emit_layer(b, x, layer, "plugin", prefix="l.")
    with pytest.raises(UsageError, match="already used"):
        emit_layer(b, x, layer, "plugin", prefix="l.")


@pytest.mark.parametrize("opset", [17, 18, 21])
def test_reductions_use_the_form_their_opset_wants(opset):
    b = GraphBuilder(opset=opset)
    x = b.add_input("x", [2, 3])
    b.add_output(b.reduce("ReduceMax", x, [1]), [2], name="m")
    b.add_output(b.reduce("ReduceSum", x, [0], keepdims=True), [1, 3], name="s")
    model = b.build("reduce")
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    m, s = session.run(None, {"x": value})
    np.testing.assert_array_equal(m, [2, 5])
    np.testing.assert_array_equal(s, [[3, 5, 7]])


def test_output_rename_keeps_values_other_nodes_read():
    b = GraphBuilder()
    x = b.add_input("x", [2])
    r = b.op("Relu", [x])
    b.add_output(b.op("Neg", [r]), [2], name="neg")
    b.add_output(r, [2], name="relu")  # r is read by Neg: goes out through an Identity
    model = b.build("g")
    assert [n.op_type for n in model.graph.node] == ["Relu", "Neg", "Identity"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, relu = session.run(None, {"x": np.array([-1, 2], np.float32)})
    np.testing.assert_array_equal(relu, [0, 2])


def test_bad_opset_and_weights_with_nan_are_usage_errors():
    with pytest.raises(UsageError, match="opset must be"):
        GraphBuilder(opset=11)
    layer = layer_of(CONFIGS["tiny"])
    with torch.no_grad():
        layer.experts.down[0, 0, 0] = float("nan")
    b = GraphBuilder()
    with pytest.raises(UsageError, match=r"experts\.down contains NaN"):
        emit_layer(b, b.add_input("x", ["T", 64]), layer, "ort", prefix="")
