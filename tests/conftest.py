"""Fixtures for the DeaMoE kernel tests (tests/plugins, tests/checks): host builds of the kernel
sources, made once per session.

- host_lib: tests/plugins/deamoe/deamoeHostTest.cpp (the device routing + plan logic compiled
  for the CPU) as a shared library; needs a C++17 compiler.
- emulated_lib: the whole kernel library (plugins/deamoe/*.cu) compiled for the CPU under
  the SIMT emulator (deamoe_trt/cuda/simt_emulator/simt_emulator.h), exporting the real C ABI;
  needs a C++20 compiler and the CUDA headers (no GPU).
Each skips with the reason when its tools are missing.

Tests marked `scale` (real sizes) skip unless DEAMOE_SCALE_TESTS=1.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest
import torch

from deamoe_trt.checks.emulated import (
    KERNEL_DIR,
    emulated_library_command,
    find_cuda_include,
    find_cxx,
)

# Tests at real sizes prove what only a real size shows (memory bounds, protobuf's 2 GiB);
# they take minutes, so the suite leaves them to .ci/run's own step.
SCALE_TESTS = os.environ.get("DEAMOE_SCALE_TESTS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SCALE_TESTS:
        return
    skip = pytest.mark.skip(reason="real size (minutes, GBs): DEAMOE_SCALE_TESTS=1 runs it, as .ci/run does")
    for item in items:
        if item.get_closest_marker("scale"):
            item.add_marker(skip)


# Test-only C entry points of the kernels' routing and plan code.
HOST_TEST_SOURCE = Path(__file__).resolve().parent / "plugins" / "deamoe" / "deamoeHostTest.cpp"


@pytest.fixture
def one_thread():
    """Many small matmuls (conversions, AWQ's searches): one thread is faster than two on a
    busy machine. Use with pytestmark = pytest.mark.usefixtures("one_thread")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def compile_shared(cxx: str, args: list[str], output: Path) -> None:
    cmd = [cxx, *args, "-shared", "-fPIC", "-o", str(output)]
    run(cmd, output)


def run(cmd: list[str], output: Path) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(f"compiling {output.name} failed:\n{' '.join(cmd)}\n{result.stderr[-4000:]}")


@pytest.fixture(scope="session")
def host_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH to build the host routing library")
    out = tmp_path_factory.mktemp("host_lib") / "libdeamoe_host_test.so"
    compile_shared(
        cxx,
        [
            "-std=c++17",
            "-O2",
            "-ffp-contract=off",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{KERNEL_DIR}",
            str(HOST_TEST_SOURCE),
        ],
        out,
    )
    return ctypes.CDLL(str(out))


@pytest.fixture(scope="session")
def emulated_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    from deamoe_trt.cuda._abi import bind

    cxx = find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH to build the SIMT-emulated kernel library")
    include = find_cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit headers (cuda_fp16.h) found via CUDA_HOME, nvcc or /usr/local/cuda")
    out = tmp_path_factory.mktemp("emulated_lib") / "libdeamoe_emulated.so"
    run(emulated_library_command(cxx, include, out), out)
    return bind(ctypes.CDLL(str(out)))
