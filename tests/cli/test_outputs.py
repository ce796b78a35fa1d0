"""Outputs are checked before the work: an unwritable place is one line and exit 2, at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from deamoe_trt.cli.main import main


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder the process may not write into (as os.access says; CI runs as root, which may)."""
    import deamoe_trt._io as io_module

    folder = tmp_path / "read-only"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(io_module.os, "access", lambda p, mode: Path(p) != folder and real_access(p, mode))
    return folder


def _exit_code(argv: list[str]) -> int:
    """main's exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_an_output_under_a_file_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _exit_code(["init", "--preset", "tiny", "-o", str(blocker / "ckpt")]) == 2
    assert f"cannot write {blocker / 'ckpt'}: {blocker} is not a directory" in _one_error_line(capsys)
    assert _exit_code(["init", "--preset", "tiny", "-o", str(blocker)]) == 2
    assert "it is a file, not a directory" in _one_error_line(capsys)


def test_a_file_output_that_is_a_directory_is_refused(tmp_path, capsys):
    assert _exit_code(["bench", "--quick", "--json", str(tmp_path)]) == 2
    assert "it is a directory; give a file name" in _one_error_line(capsys)


def test_an_unwritable_folder_is_one_line_not_an_internal_error(read_only, capsys):
    assert _exit_code(["init", "--preset", "tiny", "-o", str(read_only / "ckpt")]) == 2
    line = _one_error_line(capsys)
    assert "is not writable" in line and "internal error" not in line


def test_atomic_writes_that_the_system_refuses_are_usage_errors(tmp_path, monkeypatch):
    import deamoe_trt._io as io_module
    from deamoe_trt.errors import UsageError

    def refuse(**kwargs):
        raise PermissionError(13, "Permission denied", kwargs["dir"])

    monkeypatch.setattr(io_module.tempfile, "mkstemp", refuse)
    with pytest.raises(UsageError, match=r"cannot write .*x\.txt: \[Errno 13\] Permission denied"):
        io_module.atomic_write_text(tmp_path / "x.txt", "hello")


def test_bench_plot_without_matplotlib_fails_before_benchmarking(monkeypatch, tmp_path, capsys):
    import deamoe_trt.bench as bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(bench, "run_bench", lambda options: pytest.fail("benchmarked before checking --plot"))
    assert main(["bench", "--quick", "--plot", str(tmp_path / "b.png")]) == 1
    assert "--plot needs matplotlib" in _one_error_line(capsys)
