import shutil

import pytest

from deamoe_trt import MissingDependencyError
from deamoe_trt.cpu import _build
from deamoe_trt.cuda._library import kernel_source_dir


def _kernel_copy(tmp_path):
    """The kernel headers laid out as a wheel carries them (deamoe_trt/cuda/_src/)."""
    root = tmp_path / "_src"
    shutil.copytree(kernel_source_dir(), root, ignore=shutil.ignore_patterns("*.cu"))
    return root


def test_build_includes_the_cuda_routing_and_rebuilds_when_a_header_changes(tmp_path, monkeypatch):
    root = _kernel_copy(tmp_path)
    monkeypatch.setattr(_build, "kernel_source_dir", lambda: root)
    cxx = _build.compiler()
    assert f"-I{root}" in _build.compile_command(cxx, tmp_path / "lib.so")
    before = _build.library_path(cxx)
    # deamoeRouting.cuh includes deamoeCommon.cuh: a change there must change the cache key too.
    common = root / "deamoeCommon.cuh"
    common.write_text(common.read_text() + "\n// changed\n")
    assert _build.library_path(cxx) != before


def test_missing_routing_header_is_one_clear_error(tmp_path, monkeypatch):
    root = _kernel_copy(tmp_path)
    (root / "deamoeRouting.cuh").unlink()
    monkeypatch.setattr(_build, "kernel_source_dir", lambda: root)
    with pytest.raises(MissingDependencyError, match=r"deamoeRouting\.cuh"):
        _build.compile_command(_build.compiler(), tmp_path / "lib.so")
