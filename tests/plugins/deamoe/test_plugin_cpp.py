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

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.cuda import tuning
from deamoe_trt.native import find_cxx
from deamoe_trt.trt.doctor import tensorrt_header_dirs

pytestmark = pytest.mark.trt

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_DIR = ROOT / "plugins" / "deamoe"
KERNEL_DIR = ROOT / "native" / "cuda"  # deamoeKernels.h, which the plugin calls
# The plugin's translation units, as plugins/deamoe/plugin.cmake lists them.
PLUGIN_SOURCES = [
    PLUGIN_DIR / name
    for name in ("deamoePlugin.cpp", "deamoePluginFields.cpp", "deamoePluginUtils.cpp", "deamoeVariantTable.cpp")
]


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


@pytest.fixture(scope="module")
def harness(toolchain, tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("harness") / "harness"
    _compile(toolchain, exe, [*PLUGIN_SOURCES, Path(__file__).with_name("plugin_harness.cpp")],
             "-O1", "-DDEAMOE_PLUGIN_DYNAMIC=1")  # fmt: skip
    return exe


def _run(exe: Path, env: dict[str, str]) -> str:
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed")
    return result.stdout


def test_plugin_harness(harness):
    env = {k: v for k, v in os.environ.items() if k not in ("DEAMOE_TRT_KERNEL_TABLES", "DEAMOE_HARNESS_EXPECT")}
    _run(harness, env)


# The harness's layer (fullFields in plugin_harness.cpp) and the device its stub reports.
HARNESS_LAYER = DeaMoEConfig(
    hidden_size=32,
    num_departments=2,
    experts_per_department=4,
    shared_intermediate_size=8,
    private_intermediate_size=4,
    top_k=3,
    top_departments=1,
    shared_expert_intermediate_size=16,
    shared_expert_gate=True,
)
HARNESS_DEVICE = "Harness GPU (1)"
HARNESS_VARIANTS = ("default", "v1", "v2", "v3", "v4", "v5", "v6", "v7")  # its stub's names


def test_the_plugin_runs_the_variants_of_the_table_tuning_writes(harness, tmp_path):
    """A table written by deamoe_trt.cuda.tuning for the harness's GPU: the plugin's enqueue runs,
    at each token count, the variant tuning's own reader picks (fp16, float weights)."""
    shape = tuning.shape_key(HARNESS_LAYER)
    entries = [
        {"shape": shape, "dtype": "fp16", "bits": 0, "tokens": 1, "variant": "v5"},
        {"shape": shape, "dtype": "fp16", "bits": 0, "tokens": 4, "variant": "v3"},
        {"shape": shape, "dtype": "fp16", "bits": 0, "tokens": 16, "variant": "v6"},
        {"shape": shape, "dtype": "bf16", "bits": 0, "tokens": 1, "variant": "v1"},  # another dtype
        {"shape": shape, "dtype": "fp16", "bits": 4, "tokens": 1, "variant": "v2"},  # another format
        {"shape": shape + "0", "dtype": "fp16", "bits": 0, "tokens": 2, "variant": "v7"},  # another shape
        {"shape": shape, "dtype": "fp16", "bits": 0, "tokens": 8, "variant": "no-such-variant"},
    ]
    tuning.write_table(tmp_path / tuning.device_file_name(HARNESS_DEVICE), HARNESS_DEVICE, entries, {})
    table = tuning.load_table(HARNESS_DEVICE, str(tmp_path))
    assert table is not None
    expect = []
    for tokens in (1, 2, 3, 5, 8, 12, 16, 40):
        name = table.variant(HARNESS_LAYER, "fp16", 0, tokens)
        expect.append(f"{tokens}:{HARNESS_VARIANTS.index(name) if name in HARNESS_VARIANTS else 0}")
    assert len({e.split(":")[1] for e in expect}) >= 3  # the cases tell tiles apart
    env = dict(os.environ, DEAMOE_TRT_KERNEL_TABLES=str(tmp_path), DEAMOE_HARNESS_EXPECT=",".join(expect))
    out = _run(harness, env)
    assert "FAILED" not in out
