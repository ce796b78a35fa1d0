"""End to end on a real GPU with real TensorRT: export, build, validate against the reference.

Skipped unless TensorRT imports, a CUDA GPU is visible and (for the C++ route) the plugin
library is built (DEAMOE_TRT_PLUGIN or build/plugins). `deamoe-trt check-trt` (deamoe_trt/checks/trt_device.py)
runs the same steps and more (the qwen3-30b-a3b-layer preset, timings) as one script.
"""

from __future__ import annotations

import io

import pytest

from deamoe_trt import DeaMoEStack, get_preset
from deamoe_trt.errors import MissingDependencyError
from deamoe_trt.trt import _tensorrt

pytestmark = [pytest.mark.trt, pytest.mark.gpu]


@pytest.fixture(scope="module")
def device():
    if not _tensorrt.has_tensorrt():
        pytest.skip("TensorRT is not installed (pip install tensorrt, or JetPack)")
    from deamoe_trt.trt.device import query_gpu

    try:
        return query_gpu()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))


def _checkpoint(tmp_path, config=None):
    path = tmp_path / "ckpt"
    DeaMoEStack.random(config or get_preset("tiny"), 1, seed=3).save_pretrained(path)
    return path


def _build_and_validate(tmp_path, plugin, dtype):
    from deamoe_trt.export import export
    from deamoe_trt.trt.builder import BuildOptions, build_engine
    from deamoe_trt.validation import validate

    ckpt = _checkpoint(tmp_path)
    model = export(
        DeaMoEStack.from_pretrained(ckpt).layers[0], tmp_path / f"tiny-{dtype}.onnx", "plugin", dtype, max_tokens=16
    )
    result = build_engine(
        BuildOptions(model=model, output=tmp_path / f"tiny-{dtype}.engine", plugin=plugin, timing_cache="none"),
        progress=io.StringIO(),
    )
    report = validate(result.engine, ckpt, tokens=(1, 4, 16), plugin=plugin)
    assert report.passed, report.table()


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_cpp_plugin_engine_matches_the_reference(device, tmp_path, dtype):
    from deamoe_trt.trt.plugin import resolve_plugin

    choice = resolve_plugin(None)
    if choice.kind == "none":
        pytest.skip("the plugin library is not built (cmake -S plugins -B build/plugins -DTENSORRT_ROOT=...)")
    _build_and_validate(tmp_path, str(choice.path), dtype)


def test_python_plugin_engine_matches_the_reference(device, tmp_path):
    import torch

    from deamoe_trt.trt.qdp import MIN_TENSORRT

    if _tensorrt.tensorrt_version() < MIN_TENSORRT:
        pytest.skip("tensorrt.plugin needs TensorRT 10.6+")
    if not torch.cuda.is_available():
        pytest.skip("--plugin python needs torch with CUDA")
    _build_and_validate(tmp_path, "python", "fp16")
