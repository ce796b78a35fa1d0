"""Fixtures for the DeaMoE kernel tests: host builds of the kernel sources, made once per session.

- host_lib: plugins/deamoe/deamoeHostTest.cpp (the device routing + plan logic compiled
  for the CPU) as a shared library; needs a C++17 compiler.
- emulated_lib: the whole kernel library (plugins/deamoe/*.cu) compiled for the CPU under
  the SIMT emulator (tests/plugins/deamoe/simt_emulator.h), exporting the real C ABI;
  needs a C++20 compiler and the CUDA headers (no GPU).
Each skips with the reason when its tools are missing.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deamoe_trt.native import find_cxx

REPO = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO / "plugins" / "deamoe"
EMULATOR_DIR = Path(__file__).resolve().parent / "deamoe"


def find_cuda_include() -> Path | None:
    """A CUDA toolkit include directory (cuda_fp16.h, cuda_runtime_api.h), if any."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parents[1]))
    for home in homes:
        if home:
            include = Path(home) / "include"
            if (include / "cuda_fp16.h").is_file() and (include / "cuda_runtime_api.h").is_file():
                return include
            targets = sorted((Path(home) / "targets").glob("*/include"))
            for include in targets:
                if (include / "cuda_fp16.h").is_file():
                    return include
    return None


def compile_shared(cxx: str, args: list[str], output: Path) -> None:
    cmd = [cxx, *args, "-shared", "-fPIC", "-o", str(output)]
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
            str(KERNEL_DIR / "deamoeHostTest.cpp"),
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
    compile_shared(
        cxx,
        [
            "-std=c++20",
            "-O2",
            "-pthread",
            "-ffp-contract=off",
            "-Wall",
            "-Wextra",
            "-Wno-unknown-pragmas",
            "-Werror",
            "-Wl,--no-undefined",
            f"-I{include}",
            f"-I{KERNEL_DIR}",
            f"-I{EMULATOR_DIR}",
            str(EMULATOR_DIR / "emulated_kernels.cpp"),
        ],
        out,
    )
    return bind(ctypes.CDLL(str(out)))
