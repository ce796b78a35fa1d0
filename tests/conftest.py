"""Shared fixtures: the micro language model (micro_config, micro_model, micro_checkpoint), and for
the DeaMoE kernel tests (tests/native/cuda, tests/checks) host builds of the kernel sources, made
once per session.

- host_lib: tests/native/cuda/deamoeHostTest.cpp (the device routing + plan logic compiled
  for the CPU) as a shared library; needs a C++17 compiler.
- emulated_lib: the whole kernel library (native/cuda/*.cu) compiled for the CPU under
  the SIMT emulator (deamoe_trt/cuda/simt_emulator/simt_emulator.h), exporting the real C ABI;
  needs a C++20 compiler and the CUDA headers (no GPU).
Each skips with the reason when its tools are missing.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
import torch

from configs import MICRO_LM
from deamoe_trt.checks.emulated import (
    KERNEL_DIR,
    emulated_library_command,
    find_cuda_include,
    find_cxx,
)
from deamoe_trt.lm import DeaMoELM

# Test-only C entry points of the kernels' routing and plan code.
HOST_TEST_SOURCE = Path(__file__).resolve().parent / "native" / "cuda" / "deamoeHostTest.cpp"


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


# The micro language model (configs.MICRO_LM), random weights, and its checkpoint.
@pytest.fixture
def micro_config():
    return MICRO_LM


@pytest.fixture
def micro_model():
    return DeaMoELM.random(MICRO_LM, seed=3).eval()


@pytest.fixture
def micro_checkpoint(tmp_path, micro_model):
    return micro_model.save_pretrained(tmp_path / "micro-lm")
