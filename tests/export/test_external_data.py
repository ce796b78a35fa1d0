"""Weights go to <model>.data once they pass the threshold; every form still loads and runs."""

from __future__ import annotations

import onnx
import pytest

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
