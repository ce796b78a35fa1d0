"""Shared fixtures: the micro language model (micro_config, micro_model, micro_checkpoint), and for
the DeaMoE kernel tests (tests/native/cuda, tests/checks) host builds of the kernel sources, made
once per session.

- host_lib: tests/native/cuda/deamoeHostTest.cpp (the device routing + plan logic compiled
  for the CPU) as a shared library; needs a C++17 compiler.
- emulated_lib: the whole kernel library (native/cuda/*.cu) compiled for the CPU under
  the SIMT emulator (deamoe_trt/cuda/simt_emulator/simt_emulator.h), exporting the real C ABI;
  needs a C++20 compiler and the CUDA headers (no GPU).
Each skips with the reason when its tools are missing, and is built once per content of its
sources (host_lib: cached_build, under .pytest_cache; emulated_lib: the package's own cache,
deamoe_trt.checks.emulated.cached_emulated_library): later sessions load the same build.

Tests marked `scale` (real sizes) skip unless DEAMOE_SCALE_TESTS=1.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import torch

from configs import MICRO_LM
from deamoe_trt.checks.emulated import KERNEL_DIR, cached_emulated_library, find_cuda_include, find_cxx
from deamoe_trt.lm import DeaMoELM

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


def cached_build(request: pytest.FixtureRequest, name: str, command, inputs: list[Path]) -> Path:
    """`command(output)` built once per content: the command, the compiler's version and every
    input file's bytes make the key, under pytest's cache (.pytest_cache; --cache-clear
    rebuilds). A change to any source rebuilds, so a cached library is the one these sources
    make; the build writes a temporary name and renames it, for sessions running side by side."""
    key = hashlib.sha256()
    key.update("\0".join(command(Path("OUTPUT"))).encode())
    version = subprocess.run([command(Path("OUTPUT"))[0], "--version"], capture_output=True, text=True, check=False)
    key.update(version.stdout.encode())
    for path in sorted(inputs):
        key.update(f"\0{path}\0".encode())
        key.update(path.read_bytes())
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        base = cache.mkdir("deamoe-native")
    else:  # -p no:cacheprovider
        base = request.getfixturevalue("tmp_path_factory").mktemp(name)
    out = base / key.hexdigest()[:20] / name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{name}.{os.getpid()}.tmp")
        run(command(tmp), out)
        os.replace(tmp, out)
    return out


def files_under(*folders: Path) -> list[Path]:
    return [path for folder in folders for path in folder.rglob("*") if path.is_file()]


@pytest.fixture(scope="session")
def host_lib(request: pytest.FixtureRequest) -> ctypes.CDLL:
    cxx = find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH to build the host routing library")
    flags = ["-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", f"-I{KERNEL_DIR}"]

    def command(output: Path) -> list[str]:
        return [cxx, *flags, str(HOST_TEST_SOURCE), "-shared", "-fPIC", "-o", str(output)]

    out = cached_build(request, "libdeamoe_host_test.so", command, [HOST_TEST_SOURCE, *files_under(KERNEL_DIR)])
    return ctypes.CDLL(str(out))


@pytest.fixture(scope="session")
def emulated_lib() -> ctypes.CDLL:
    from deamoe_trt.cuda._abi import bind

    if find_cxx() is None:
        pytest.skip("no C++ compiler on PATH to build the SIMT-emulated kernel library")
    if find_cuda_include() is None:
        pytest.skip("no CUDA toolkit headers (cuda_fp16.h) found via CUDA_HOME, nvcc or /usr/local/cuda")
    # The package's own cached build (keyed by its sources, headers and compiler): the cuda-emulated
    # runtime and `check-gpu --dry-run`, which tests and the doc-block test run, load the same file,
    # so the library compiles once per source, not once for the tests and again for those.
    return bind(ctypes.CDLL(str(cached_emulated_library())))


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
