"""The output discipline of deamoe_trt/_io.py: temporaries, permissions, replacement, checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from deamoe_trt import _io
from deamoe_trt.errors import UsageError


def _dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_atomic_files_get_the_mode_the_umask_gives_even_when_the_writer_replaces_them(tmp_path):
    import torch
    from safetensors.torch import save_file

    old = os.umask(0o027)
    try:
        with _io.atomic_path(tmp_path / "w.safetensors") as tmp:
            save_file({"x": torch.zeros(2)}, str(tmp))
    finally:
        os.umask(old)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o640


def test_a_killed_writers_temporaries_are_swept_by_the_next_write_and_a_live_ones_kept(tmp_path):
    dead = tmp_path / f".x.txt.deamoe-{_dead_pid()}-abc.tmp"
    live = tmp_path / f".x.txt.deamoe-{os.getppid()}-abc.tmp"
    other = tmp_path / ".notes.txt"  # not ours: never touched
    for path in (dead, live, other):
        path.write_text("partial")
    _io.atomic_write_text(tmp_path / "x.txt", "whole")
    assert not dead.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "x.txt"])


def test_an_interrupted_write_leaves_no_temporary(tmp_path):
    with pytest.raises(KeyboardInterrupt), _io.atomic_path(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("output", "inputs", "message"),
    [
        ("ckpt", ["ckpt"], "is the input"),
        ("ckpt/model.safetensors", ["ckpt"], "lies inside the input"),
        ("ckpt/../ckpt/sub/x.onnx", ["ckpt"], "lies inside the input"),
        (".", ["ckpt"], "holds the input"),
    ],
)
def test_an_output_that_is_holds_or_lies_in_an_input_is_refused(tmp_path, monkeypatch, output, inputs, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(UsageError, match=message):
        _io.check_not_input(output, inputs)


def test_an_output_beside_an_input_is_allowed(tmp_path):
    (tmp_path / "ckpt").mkdir()
    _io.check_not_input(tmp_path / "ckpt-int4", [tmp_path / "ckpt"])  # a shared prefix is not inside


def test_names_past_the_file_systems_limit_are_refused_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="longer than 255 bytes"):
        _io.check_writable(tmp_path / ("a" * 256) / "x", directory=True)
    with pytest.raises(UsageError, match="longer than 4095 bytes"):
        _io.check_writable(tmp_path / "/".join(["b" * 200] * 21))


def test_a_place_the_system_refuses_is_found_before_the_work():
    # /proc lets root pass os.access yet holds no new files.
    with pytest.raises(UsageError, match="cannot write /proc/x"):
        _io.check_writable("/proc/x")


def _ours(folder):
    return (folder / "mark").exists()


def test_a_replaced_directory_keeps_no_file_of_the_old_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mark").write_text("")
    (out / "README.md").write_text("describes the old model")
    notes = []
    with _io.replaced_directory(out, _ours, "thing", note=notes.append) as staging:
        (staging / "mark").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["mark"] and (out / "mark").read_text() == "new"
    assert notes == [f"replaced what was in {out}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging, no old copy


def test_a_foreign_directory_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "weights.bin").write_text("precious")
    with pytest.raises(UsageError, match=r"refusing to replace .*--force"), _io.replaced_directory(out, _ours, "x"):
        pytest.fail("the block ran over a foreign directory")
    assert (out / "weights.bin").read_text() == "precious"
    with _io.replaced_directory(out, _ours, "thing", force=True) as staging:
        (staging / "mark").write_text("")
    assert sorted(p.name for p in out.iterdir()) == ["mark"]


def test_a_failed_replacement_leaves_the_old_output_whole(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mark").write_text("old")
    with pytest.raises(KeyboardInterrupt), _io.replaced_directory(out, _ours, "thing") as staging:
        (staging / "mark").write_text("half")
        raise KeyboardInterrupt
    assert (out / "mark").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_killed_runs_staging_folder_is_swept_by_the_next_run(tmp_path):
    stale = tmp_path / f".out.deamoe-{_dead_pid()}-x.tmp"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.safetensors").write_bytes(b"175 MB once")
    with _io.replaced_directory(tmp_path / "out", _ours, "thing") as staging:
        (staging / "mark").write_text("")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
