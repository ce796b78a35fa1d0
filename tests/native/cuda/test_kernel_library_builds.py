"""The kernel library builds with CMake + nvcc (no GPU needed) and ptxas reports no spills.

One architecture here (sm_90, the H200's) to keep the suite fast, built once per content of
native/cuda/ and the toolchain (kernel_build); native/cuda/build_kernels.sh builds all default
architectures with the same checks.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs nvcc/CMake

KERNELS = Path(__file__).resolve().parents[3] / "native" / "cuda"


def _nvcc() -> str | None:
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def tools():
    nvcc, cmake = _nvcc(), shutil.which("cmake")
    if nvcc is None or cmake is None:
        pytest.skip("building the kernels needs nvcc and cmake")
    return nvcc, cmake


def _configure(tools, build: Path, *options: str) -> str:
    nvcc, cmake = tools
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmd = [cmake, "-S", str(KERNELS), "-B", str(build), *generator, f"-DCMAKE_CUDA_COMPILER={nvcc}", *options]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _nvcc_version(nvcc: str) -> tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    major, minor = re.search(r"release (\d+)\.(\d+)", out).groups()
    return int(major), int(minor)


def test_default_architectures_follow_the_cuda_version(tools, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDAARCHS", raising=False)
    out = _configure(tools, tmp_path / "build")
    archs = re.search(r"DeaMoE: CUDA \S+, architectures (\S+)", out).group(1)
    version = _nvcc_version(tools[0])
    thor = ["110"] if version >= (13, 0) else ["101"] if version >= (12, 8) else []
    assert archs.split(";") == ["86", "87", "89", "90", *thor]


@pytest.fixture(scope="module")
def kernel_build(tools, request, tmp_path_factory) -> tuple[Path, str]:
    """The sm_90 build's folder (libdeamoe_kernels.so and .a) and its log, made once per content:
    every file under native/cuda/, the options and the versions of nvcc, CMake and the host compiler
    make the key, under pytest's cache (--cache-clear rebuilds). A cached build is the build of
    exactly these sources with these tools, so what the test reads from it holds for them."""
    options = ["-DCMAKE_CUDA_ARCHITECTURES=90", "-DDEAMOE_PTXAS_VERBOSE=ON"]
    key = hashlib.sha256("\0".join(options).encode())
    for tool in (*tools, shutil.which("c++") or "c++", shutil.which("ninja") or "make"):
        key.update(subprocess.run([tool, "--version"], capture_output=True, text=True, check=False).stdout.encode())
    for path in sorted(p for p in KERNELS.rglob("*") if p.is_file()):
        key.update(f"\0{path.relative_to(KERNELS)}\0".encode() + path.read_bytes())
    cache = getattr(request.config, "cache", None)
    folder = (cache.mkdir("deamoe-kernels") if cache else tmp_path_factory.mktemp("kernels")) / key.hexdigest()[:20]
    names = ("libdeamoe_kernels.so", "libdeamoe_kernels.a", "build.log")
    if not all((folder / name).is_file() for name in names):
        build = tmp_path_factory.mktemp("kernel_build")
        _configure(tools, build, *options)
        result = subprocess.run(
            [tools[1], "--build", str(build), "--target", "deamoe_kernels", "deamoe_kernels_static", "-j", "2"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        log = result.stdout + result.stderr
        assert result.returncode == 0, log[-6000:]
        (build / "build.log").write_text(log)
        staging = folder.with_name(f".{folder.name}.{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copy2(build / name, staging / name)
        if folder.exists():  # another session finished it first
            shutil.rmtree(staging)
        else:
            staging.rename(folder)
    return folder, (folder / "build.log").read_text()


def test_kernel_library_builds_without_spills_and_exports_the_c_abi(kernel_build):
    build, log = kernel_build
    reports = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(reports) >= 16, "expected ptxas reports for every kernel"
    assert all(stores == "0" and loads == "0" for stores, loads in reports), "ptxas reports register spills"
    assert (build / "libdeamoe_kernels.a").is_file()

    # The shared library loads without a GPU (static CUDA runtime) and its host-only
    # entry points work.
    from deamoe_trt.cuda._abi import bind, layer_params
    from deamoe_trt.presets import PRESETS

    lib = bind(ctypes.CDLL(str(build / "libdeamoe_kernels.so")))
    params = layer_params(PRESETS["deepseek-v3-layer"])
    assert lib.deamoe_validate(ctypes.byref(params)) == 0
    assert lib.deamoe_workspace_size(ctypes.byref(params), 1, 2) > 0
    assert lib.deamoe_max_tile_tokens() == 16
