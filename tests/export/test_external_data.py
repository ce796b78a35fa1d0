"""Weights go to <model>.data once they pass the threshold; every form still loads and runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from deamoe_trt.export import data_path, export
from deamoe_trt.validation import make_session

from .conftest import CONFIGS, TOLERANCE, layer_of, max_error


@pytest.mark.slow
@pytest.mark.parametrize("form", ["plugin", "ort", "onnx"])
def test_weights_past_the_threshold_go_to_a_data_file_beside_the_model(tmp_path, form):
    layer = layer_of(CONFIGS["tiny"], seed=6)
    path = export(layer, tmp_path / "m.onnx", form, external_data_threshold=10_000)
    data = data_path(path)
    assert data.name == "m.onnx.data" and data.is_file()
    model = onnx.load(str(path), load_external_data=False)
    external = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    # The ort form stores gate_up interleaved for com.microsoft.MoE, under its own name.
    assert {"experts.down", "router.weight"} <= external
    assert any(name.startswith("experts.gate_up") for name in external)
    assert path.stat().st_size < 20_000 < data.stat().st_size
    assert max_error(make_session(path), layer, 5) <= TOLERANCE["fp32"]


def test_model_under_the_threshold_is_one_file_and_replaces_a_stale_data_file(tmp_path):
    layer = layer_of(CONFIGS["tiny"])
    path = export(layer, tmp_path / "m.onnx", "onnx", external_data_threshold=0)
    assert data_path(path).exists()
    export(layer, path, "onnx")
    assert not data_path(path).exists()
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in onnx.load(str(path)).graph.initializer)


def test_failed_export_leaves_no_file(tmp_path):
    layer = layer_of(CONFIGS["tiny"])
    with pytest.raises(Exception, match="bf16"):
        export(layer, tmp_path / "m.onnx", "ort", "bf16", external_data_threshold=0)
    assert list(tmp_path.iterdir()) == []


def _gather_model(rows: int, cols: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """ids [n] -> rows of a [rows, cols] fp16 table whose row i holds i % 2048 (exact in fp16)."""
    table = np.empty((rows, cols), dtype=np.float16)
    table[:] = (np.arange(rows) % 2048).astype(np.float16)[:, None]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])],
        "gather",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("rows", onnx.TensorProto.FLOAT16, ["n", cols])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # Filled in place: onnx.helper copies tensors through protobuf, which refuses 2 GiB.
    tensor = model.graph.initializer.add()
    tensor.name, tensor.data_type = "table", onnx.TensorProto.FLOAT16
    tensor.dims.extend(table.shape)
    tensor.raw_data = table.tobytes()
    return model, table


def test_in_memory_model_past_the_threshold_opens_through_external_data(monkeypatch):
    from deamoe_trt.export import save

    model, table = _gather_model(64, 256)
    monkeypatch.setattr(save, "EXTERNAL_DATA_THRESHOLD", 10_000)
    session = make_session(model)
    ids = np.array([3, 63, 0])
    np.testing.assert_array_equal(session.run(None, {"ids": ids})[0], table[ids])
    # The caller's model keeps its weights inside it.
    assert all(t.data_location == onnx.TensorProto.DEFAULT and t.raw_data for t in model.graph.initializer)


@pytest.mark.slow
@pytest.mark.scale
def test_in_memory_model_over_two_gigabytes_opens_on_onnx_runtime():
    """Protobuf's 2 GiB limit: serialising such a model in memory fails ("narrowing_error"
    from ONNX Runtime); make_session opens it through external data instead. Only a model
    past the real limit shows that the threshold sits below it (the path itself is checked
    at 10 kB above), so this one runs at 2.15 GiB, in .ci/run's real-size step."""
    rows, cols = 2**20 + 2**16, 1024  # 2.15 GiB of fp16
    model, table = _gather_model(rows, cols)
    assert len(model.graph.initializer[0].raw_data) > 2**31
    session = make_session(model)
    ids = np.array([rows - 1, 2047, 2048, 5])
    np.testing.assert_array_equal(session.run(None, {"ids": ids})[0], table[ids])
