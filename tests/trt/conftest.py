"""Fixtures for the TensorRT tests: fake GPUs, a fake `tensorrt` module, small exported models."""

from __future__ import annotations

from pathlib import Path

import pytest

from deamoe_trt import DeaMoELayer, get_preset
from deamoe_trt.trt import _tensorrt
from deamoe_trt.trt.targets import GiB, GpuInfo

from . import fake_tensorrt

A40 = GpuInfo("NVIDIA A40", (8, 6), 48 * GiB, 12060)
AGX_ORIN = GpuInfo("Orin", (8, 7), 61 * GiB, 12060, integrated=True)
ORIN_NANO = GpuInfo("Orin", (8, 7), int(7.4 * GiB), 12060, integrated=True)
H100 = GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 12080)
H200 = GpuInfo("NVIDIA H200", (9, 0), 141 * GiB, 12080)
THOR = GpuInfo("NVIDIA Thor", (11, 0), 122 * GiB, 13000, integrated=True)
THOR_CUDA12 = GpuInfo("NVIDIA Thor", (10, 1), 122 * GiB, 12090, integrated=True)
RTX_4090 = GpuInfo("NVIDIA GeForce RTX 4090", (8, 9), 24 * GiB, 12080)


@pytest.fixture
def fake_trt(monkeypatch):
    """make(version, **settings) -> a fake tensorrt module that deamoe_trt.trt will import."""

    def make(version: str = "10.3.0", **settings):
        module = fake_tensorrt.make(version, **settings)
        monkeypatch.setattr(_tensorrt, "_override", module)
        return module

    return make


@pytest.fixture
def no_plugin_search(monkeypatch, tmp_path):
    """No plugin library anywhere: the search finds nothing."""
    from deamoe_trt.trt import plugin

    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    monkeypatch.setattr(plugin, "candidate_paths", lambda: iter([tmp_path / "none" / "libdeamoe_plugin.so"]))


def export_model(directory: Path, *, dtype: str = "fp16", max_tokens: int | None = 32, config=None, form="plugin"):
    from deamoe_trt.export import export

    layer = DeaMoELayer.random(config or get_preset("tiny"), seed=0)
    return export(layer, directory / f"model-{form}-{dtype}.onnx", form, dtype, max_tokens=max_tokens)


@pytest.fixture
def tiny_fp16(tmp_path) -> Path:
    return export_model(tmp_path, dtype="fp16")


@pytest.fixture
def tiny_fp32(tmp_path) -> Path:
    return export_model(tmp_path, dtype="fp32", max_tokens=None)
