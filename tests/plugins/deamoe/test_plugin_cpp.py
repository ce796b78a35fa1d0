"""The C++ plugin's TensorRT glue, compiled against TensorRT headers and driven by plugin_harness.cpp.

Needs TensorRT's headers (not its libraries, not a GPU): set TENSORRT_ROOT, or
DEAMOE_TRT_HEADERS to the folder holding NvInferRuntime.h (e.g. include/ of a checkout of
github.com/NVIDIA/TensorRT at the release tag). Skipped without them, as in CI.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deamoe_trt.native import find_cxx
from deamoe_trt.trt.doctor import tensorrt_header_dirs

pytestmark = pytest.mark.trt

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_DIR = ROOT / "plugins" / "deamoe"
KERNEL_DIR = ROOT / "native" / "cuda"  # deamoeKernels.h, which the plugin calls
# The plugin's translation units, as plugins/deamoe/plugin.cmake lists them.
PLUGIN_SOURCES = [PLUGIN_DIR / name for name in ("deamoePlugin.cpp", "deamoePluginFields.cpp", "deamoePluginUtils.cpp")]


def _headers() -> Path | None:
    env = os.environ.get("DEAMOE_TRT_HEADERS")
    candidates = [Path(env)] if env else tensorrt_header_dirs()
    return next((d for d in candidates if (d / "NvInferRuntime.h").is_file()), None)


def _cuda_include() -> Path | None:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda", "/usr"]
    return next(
        (Path(r) / "include" for r in roots if r and (Path(r) / "include" / "cuda_runtime_api.h").is_file()), None
    )


@pytest.fixture(scope="module")
def toolchain():
    headers, cuda, cxx = _headers(), _cuda_include(), find_cxx()
    if headers is None:
        pytest.skip("TensorRT headers not found (set TENSORRT_ROOT or DEAMOE_TRT_HEADERS to compile the plugin)")
    if cuda is None:
        pytest.skip("CUDA headers (cuda_runtime_api.h) not found (set CUDA_HOME)")
    if cxx is None:
        pytest.skip("no C++ compiler")
    return headers, cuda, cxx


def _compile(toolchain, out: Path, sources: list[Path], *extra: str) -> None:
    headers, cuda, cxx = toolchain
    cmd = [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{PLUGIN_DIR}", f"-I{KERNEL_DIR}",
           "-isystem", str(headers), "-isystem", str(cuda), *extra, *map(str, sources), "-o", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-4000:]}"


@pytest.mark.parametrize("dynamic", [0, 1])
@pytest.mark.parametrize("plugin_source", PLUGIN_SOURCES, ids=lambda p: p.name)
def test_plugin_compiles_cleanly(toolchain, tmp_path, dynamic, plugin_source):
    _compile(toolchain, tmp_path / "plugin.o", [plugin_source], "-c", "-fPIC",
             f"-DDEAMOE_PLUGIN_DYNAMIC={dynamic}")  # fmt: skip


def test_plugin_harness(toolchain, tmp_path):
    exe = tmp_path / "harness"
    _compile(toolchain, exe, [*PLUGIN_SOURCES, Path(__file__).with_name("plugin_harness.cpp")],
             "-O1", "-DDEAMOE_PLUGIN_DYNAMIC=1")  # fmt: skip
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed")
