"""plugins/CMakeLists.txt: the plugin's build adds the kernel library (native/cuda/) and, with
TENSORRT_ROOT, the two plugin libraries that link it.

Configure only (no compile, no GPU), against a stand-in TensorRT root that holds just the two
headers CMake reads; tests/plugins/deamoe/test_plugin_cpp.py compiles the glue against real
TensorRT headers, tests/native/cuda/test_kernel_library_builds.py compiles the kernels.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deamoe_trt.cuda._library import KernelBuildError, _find_nvcc

pytestmark = pytest.mark.slow  # CMake's CUDA compiler checks run nvcc

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
KERNEL_TARGETS = {"deamoe_kernels", "deamoe_kernels_static"}
PLUGIN_TARGETS = {"deamoe_plugin", "deamoe_plugin_dynamic"}


@pytest.fixture(scope="module")
def tools():
    cmake = shutil.which("cmake")
    try:
        nvcc = _find_nvcc()
    except KernelBuildError:
        nvcc = None
    if nvcc is None or cmake is None:
        pytest.skip("configuring the plugin's build needs nvcc and cmake")
    return nvcc, cmake


def configure(tools, build: Path, *options: str) -> tuple[str, set[str]]:
    """CMake's output and the DeaMoE targets the configured build offers."""
    nvcc, cmake = tools
    cmd = [cmake, "-S", str(PLUGINS), "-B", str(build), f"-DCMAKE_CUDA_COMPILER={nvcc}",
           "-DCMAKE_CUDA_ARCHITECTURES=90", *options]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = subprocess.run([cmake, "--build", str(build), "--target", "help"], capture_output=True, text=True)
    targets = set(re.findall(r"\b(deamoe_\w+)", listed.stdout))
    return result.stdout + result.stderr, targets


def test_without_tensorrt_the_build_is_the_kernel_library(tools, tmp_path):
    out, targets = configure(tools, tmp_path / "build")
    assert targets >= KERNEL_TARGETS
    assert not PLUGIN_TARGETS & targets
    # The kernel library's folder, added as a subdirectory, leaves the architectures to the
    # project that adds it: one report, the list asked for.
    assert re.findall(r"DeaMoE: CUDA \S+, architectures (\S+)", out) == ["90"]


def test_with_tensorrt_the_plugin_libraries_link_the_kernel_library(tools, tmp_path):
    root = tmp_path / "tensorrt"
    (root / "include").mkdir(parents=True)
    (root / "include" / "NvInferRuntime.h").write_text("")
    (root / "include" / "NvInferVersion.h").write_text(
        "#define NV_TENSORRT_MAJOR 10\n#define NV_TENSORRT_MINOR 8\n#define NV_TENSORRT_PATCH 0\n"
    )
    build = tmp_path / "build"
    out, targets = configure(tools, build, f"-DTENSORRT_ROOT={root}", "-DDEAMOE_PLUGIN_ALLOW_MISSING_NVINFER=ON")
    assert targets >= KERNEL_TARGETS | PLUGIN_TARGETS
    assert "DeaMoE plugin: TensorRT 10.8.0" in out and "kernels: deamoe::kernels" in out
