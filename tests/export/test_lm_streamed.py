"""export_lm streams each weight to the external data file as it is made: the same model and
data files as building the whole graph in memory and saving it, and the same logits."""

import io

import numpy as np
import pytest

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt.export import ExternalData, save_model
from deamoe_trt.export.lm import build_lm_model, export_lm
from deamoe_trt.export.save import MIN_EXTERNAL_TENSOR
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.quant import QuantConfig
from deamoe_trt.runtimes.onnxruntime import OrtDecoder

IDS = [5, 17, 99, 3, 42, 7]


@pytest.fixture(scope="module")
def int4_model():
    return DeaMoELM.random(QUANTIZABLE_MICRO_LM.replace(quantization=QuantConfig(4, 16)), seed=4).eval()


@pytest.fixture(scope="module")
def float_model():
    return DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=4).eval()


# threshold 0: every model goes out to external data (what past 2 GB does); the default keeps these inline.
@pytest.mark.parametrize("threshold", [0, None], ids=["external", "inline"])
@pytest.mark.parametrize(("which", "form"), [("int4", "ort"), ("int4", "onnx"), ("float", "ort"), ("float", "plugin")])
def test_streamed_files_are_the_in_memory_files(int4_model, float_model, which, form, threshold, tmp_path):
    model = int4_model if which == "int4" else float_model
    kwargs = {} if threshold is None else {"external_data_threshold": threshold}
    memory, streamed = tmp_path / "memory" / "model.onnx", tmp_path / "streamed" / "model.onnx"
    memory.parent.mkdir()
    save_model(build_lm_model(model, form), memory, **kwargs)
    export_lm(model, streamed, form, **kwargs)
    assert streamed.read_bytes() == memory.read_bytes()
    data = [p.with_name("model.onnx.data") for p in (memory, streamed)]
    assert data[1].exists() == data[0].exists() == (threshold == 0)
    if threshold == 0:
        assert data[1].read_bytes() == data[0].read_bytes()
        assert streamed.stat().st_size < data[1].stat().st_size  # the weights are not in the model file
    assert sorted(p.name for p in streamed.parent.iterdir()) == sorted(p.name for p in memory.parent.iterdir())


def test_an_external_export_runs_with_the_in_memory_logits(int4_model, tmp_path):
    path = export_lm(int4_model, tmp_path / "model.onnx", "ort", external_data_threshold=0)
    from_file, in_memory = OrtDecoder.from_file(path), OrtDecoder.from_model(int4_model, form="ort")
    np.testing.assert_array_equal(from_file.prefill(IDS), in_memory.prefill(IDS))
    np.testing.assert_array_equal(from_file.step(11), in_memory.step(11))


def test_the_graph_holds_no_weight_while_streaming(int4_model):
    external = ExternalData(io.BytesIO(), "model.onnx.data")
    proto = build_lm_model(int4_model, "ort", external=external)
    inline = [len(t.raw_data) for t in proto.graph.initializer]
    assert max(inline) < MIN_EXTERNAL_TENSOR
    # Never held: not even cleared bytes, which the proto's arena would keep until it goes.
    assert not any(t.HasField("raw_data") for t in proto.graph.initializer if t.data_location == t.EXTERNAL)
    assert external.initializer_bytes > external.f.tell() >= 0.9 * external.initializer_bytes


def test_a_stale_data_file_is_removed_when_the_new_model_needs_none(int4_model, tmp_path):
    path = tmp_path / "model.onnx"
    export_lm(int4_model, path, "ort", external_data_threshold=0)
    assert path.with_name("model.onnx.data").exists()
    export_lm(int4_model, path, "ort")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert OrtDecoder.from_file(path).prefill(IDS).shape == (QUANTIZABLE_MICRO_LM.vocab_size,)


def test_a_failure_midway_leaves_no_file(tmp_path):
    import torch

    from deamoe_trt.errors import UsageError

    broken = DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=4).eval()
    with torch.no_grad():
        broken.layers[2].mlp.experts.down.view(-1)[0] = float("nan")  # the last block: most weights already out
    with pytest.raises(UsageError, match="contains NaN or Inf"):
        export_lm(broken, tmp_path / "model.onnx", "ort", external_data_threshold=0)
    assert list(tmp_path.iterdir()) == []
