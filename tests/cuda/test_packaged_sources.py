"""A wheel carries the CUDA kernel sources, so a non-editable install can build the binding."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import deamoe_trt
from deamoe_trt.cuda._library import kernel_source_dir, source_tree_kernel_dir
from deamoe_trt.cuda._sources import kernel_sources

REPO = Path(__file__).resolve().parents[2]


def test_source_finder_falls_back_to_the_checkouts_kernels(tmp_path):
    # No _src/ in tmp_path: an editable install, whose checkout is this repository.
    assert kernel_source_dir(tmp_path) == source_tree_kernel_dir() == REPO / "native" / "cuda"


def test_source_finder_without_a_checkout_names_the_packaged_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("deamoe_trt.cuda._library.checkout_root", lambda: None)
    assert source_tree_kernel_dir() is None
    assert kernel_source_dir(tmp_path) == tmp_path / "_src"


@pytest.mark.slow
def test_wheel_carries_the_kernel_sources_and_the_finder_uses_them(tmp_path):
    pip_wheel = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q"]
    result = subprocess.run(
        [*pip_wheel, "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("deamoe_trt-*.whl")
    kernels = REPO / "native" / "cuda"
    expected = {f"deamoe_trt/cuda/_src/{f.relative_to(kernels).as_posix()}": f for f in kernel_sources(kernels)}
    # The patterns really match: the sources, and the CMake files the build reads.
    assert {"deamoeKernels.cu", "deamoeRouting.cuh", "CMakeLists.txt", "architectures.cmake"} <= {
        f.name for f in expected.values()
    }
    with zipfile.ZipFile(wheel) as archive:
        packaged = {name for name in archive.namelist() if name.startswith("deamoe_trt/cuda/_src/")}
        assert packaged == set(expected)
        for name, source in expected.items():
            assert archive.read(name) == source.read_bytes(), name
        assert not any("deamoePlugin" in name or name.endswith("plugin.cmake") for name in archive.namelist())
        # What the product runs beside the kernels ships too: the tiny models, the prompts and
        # the SIMT emulator (tests/test_package_paths.py keeps the package off the repository).
        package = Path(deamoe_trt.__file__).resolve().parent
        shipped = [
            *(package / "lm" / "data").glob("tiny-lm*/*"),
            package / "lm" / "data" / "prompts.txt",
            *(package / "cuda" / "simt_emulator").iterdir(),
        ]
        assert len(shipped) >= 8
        for source in shipped:
            name = source.relative_to(package.parent).as_posix()
            assert archive.read(name) == source.read_bytes(), name
        archive.extractall(tmp_path / "site")
    package_dir = tmp_path / "site" / "deamoe_trt" / "cuda"
    assert kernel_source_dir(package_dir) == package_dir / "_src"
