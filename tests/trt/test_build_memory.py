"""`build` states the memory it needs and refuses what the target cannot hold, before TensorRT."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from deamoe_trt.cli.main import main as cli
from deamoe_trt.errors import MissingDependencyError, UsageError
from deamoe_trt.fit import GIB, RESERVE_BYTES, TARGET_MEMORY
from deamoe_trt.trt.builder import ACTIVATION_FACTOR, BuildOptions, build_engine

D = 64


def model_with_external_weights(tmp_path, data_bytes: int):
    """y = x @ W with W in external data, its file then made data_bytes long (sparse: no disk used)."""
    w = numpy_helper.from_array(np.zeros((D, D), np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["tokens", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["tokens", D])],
        [w],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, location="model.data", size_threshold=0)
    os.truncate(tmp_path / "model.data", data_bytes)
    return path


def test_a_14_gb_model_is_refused_for_orin_nano_in_one_line_with_its_parts(tmp_path, capsys):
    model = model_with_external_weights(tmp_path, 14 * 10**9)
    out = tmp_path / "out" / "m.engine"
    assert cli(["build", str(model), "--target", "orin-nano", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    stated, refusal = err[0], err[-1]
    assert stated.startswith("[build] memory for orin-nano: device") and "weights 14.00 GB" in stated
    assert "target orin-nano (8.59 GB, shared by CPU and GPU) has 8.59 GB; this needs" in refusal
    assert not out.exists() and not out.parent.exists()


def test_the_need_is_the_files_plus_activations_workspace_and_reserve(tmp_path, capsys):
    model = model_with_external_weights(tmp_path, 3 * 10**9)
    weights = model.stat().st_size + (tmp_path / "model.data").stat().st_size
    # h200 holds it: the statement is printed, then TensorRT (absent here) is what stops the build.
    with pytest.raises(MissingDependencyError, match="TensorRT"):
        build_engine(BuildOptions(model, tmp_path / "m.engine", target="h200", max_tokens=100, workspace_mib=512))
    stated = capsys.readouterr().err
    activations = ACTIVATION_FACTOR * 100 * (2 * D * 2)  # x and y, fp16, per token
    device = weights + activations + 512 * 2**20 + RESERVE_BYTES
    from deamoe_trt.console import format_bytes

    assert f"device {format_bytes(device)} (weights {format_bytes(weights)}" in stated
    assert f"host {format_bytes(2 * weights + RESERVE_BYTES)}" in stated and "shared" not in stated


def test_device_memory_overrides_the_targets(tmp_path):
    model = model_with_external_weights(tmp_path, 12 * 10**9)
    assert TARGET_MEMORY["orin"] == (16 * GIB, True)
    with pytest.raises(UsageError, match="target orin"):
        build_engine(BuildOptions(model, tmp_path / "m.engine", target="orin"))
    with pytest.raises(MissingDependencyError):  # an AGX Orin 64 GB holds it
        build_engine(BuildOptions(model, tmp_path / "m.engine", target="orin", device_memory=64 * GIB))
