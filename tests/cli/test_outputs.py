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


# One output discipline for every writer: no input lost, no other output replaced silently.


def _layer_checkpoint(path):
    from deamoe_trt import DeaMoEStack
    from deamoe_trt.presets import get_preset

    return DeaMoEStack.random(get_preset("tiny"), 1, seed=0).save_pretrained(path)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("inside", ["model.safetensors", "config.json", "new.onnx"])
def test_export_into_its_own_checkpoint_is_refused_and_the_checkpoint_kept(tmp_path, capsys, inside):
    ckpt = _layer_checkpoint(tmp_path / "ckpt")
    before = _snapshot(ckpt)
    assert _exit_code(["export", str(ckpt), "-o", str(ckpt / inside), "--form", "onnx"]) == 2
    assert "lies inside the input" in _one_error_line(capsys)
    assert _snapshot(ckpt) == before


def test_export_lm_into_its_own_checkpoint_is_refused_and_the_checkpoint_kept(micro_checkpoint, capsys):
    before = _snapshot(micro_checkpoint)
    target = micro_checkpoint / "model.safetensors"
    assert _exit_code(["export-lm", str(micro_checkpoint), "-o", str(target), "--form", "onnx"]) == 2
    assert "lies inside the input" in _one_error_line(capsys)
    assert _snapshot(micro_checkpoint) == before


def test_init_over_a_trained_model_is_refused_and_with_force_leaves_none_of_its_files(micro_checkpoint, capsys):
    (micro_checkpoint / "README.md").write_text("the trained model")
    before = _snapshot(micro_checkpoint)
    assert _exit_code(["init", "-o", str(micro_checkpoint)]) == 2
    assert "not a deamoe-trt layer checkpoint" in _one_error_line(capsys) and _snapshot(micro_checkpoint) == before
    assert _exit_code(["init", "-o", str(micro_checkpoint), "--force"]) == 0
    assert sorted(p.name for p in micro_checkpoint.iterdir()) == ["config.json", "model.safetensors"]
    assert f"note: replaced what was in {micro_checkpoint}" in capsys.readouterr().err


def test_init_over_its_own_output_replaces_it_whole_and_says_so(tmp_path, capsys):
    ckpt = _layer_checkpoint(tmp_path / "ckpt")
    (ckpt / "stale.txt").write_text("from before")
    assert _exit_code(["init", "-o", str(ckpt), "--seed", "5"]) == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]
    assert "note: replaced what was in" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary stays


def test_written_weights_are_readable_as_the_umask_allows(tmp_path):
    old = os.umask(0o022)
    try:
        assert _exit_code(["init", "-o", str(tmp_path / "ckpt")]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "ckpt").iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o755


def test_triton_repo_refuses_two_models_of_one_name(tmp_path, micro_checkpoint, capsys):
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"")
    argv = ["triton-repo", "-o", str(tmp_path / "repo"), "--lm", str(micro_checkpoint), "--ort", str(onnx)]
    assert _exit_code([*argv, "--lm-name", "x", "--ort-name", "x"]) == 2
    assert "--ort-name and --lm-name are both 'x'" in _one_error_line(capsys)
    assert not (tmp_path / "repo").exists()


def test_quantize_interrupted_leaves_nothing_and_keeps_the_older_output(tmp_path, monkeypatch, capsys):
    import deamoe_trt.layer as layer

    ckpt = _layer_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "int4"
    argv = ["quantize", str(ckpt), "-o", str(out), "--bits", "4", "--group-size", "16", "--no-compare"]
    assert _exit_code(argv) == 0
    before = _snapshot(out)

    def interrupted(directory, tensors, header):
        (Path(directory) / "tokenizer.json").write_text("{}")  # a first file, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(layer, "write_files", interrupted)
    capsys.readouterr()
    assert _exit_code(argv) == 130
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "int4"]


@pytest.mark.parametrize(
    "argv",
    [
        ["init", "-o", "{long}"],
        ["export", "{ckpt}", "-o", "{long}/m.onnx", "--form", "onnx"],
        ["quantize", "{ckpt}", "-o", "{long}", "--bits", "4", "--group-size", "16"],
        ["convert", "{ckpt}", "-o", "{long}", "--departments", "2", "--top-departments", "1", "--shared-size", "4"],
        ["bench", "--quick", "--json", "{long}.json"],
        ["triton-repo", "-o", "{long}", "--lm", "{ckpt}"],
        ["export-vllm", "{ckpt}", "-o", "{long}"],
        ["import-hf", "{ckpt}", "-o", "{long}"],
        ["export-lm", "{ckpt}", "-o", "{long}.onnx"],
    ],
)
def test_a_name_past_the_file_systems_limit_is_one_line_before_any_work(tmp_path, capsys, argv):
    ckpt = _layer_checkpoint(tmp_path / "ckpt")
    long = str(tmp_path / ("n" * 300))
    argv = [a.format(long=long, ckpt=ckpt) for a in argv]
    assert _exit_code(argv) == 2
    assert "is longer than 255 bytes" in _one_error_line(capsys)


def test_bench_json_to_a_place_the_system_refuses_fails_before_benchmarking(monkeypatch, capsys):
    import deamoe_trt.bench as bench

    monkeypatch.setattr(bench, "run_bench", lambda options: pytest.fail("benchmarked before checking --json"))
    assert _exit_code(["bench", "--quick", "--json", "/proc/x"]) == 2
    assert "cannot write /proc/x" in _one_error_line(capsys)


@pytest.mark.slow  # a conversion
def test_convert_reruns_into_its_own_output_directory(tmp_path, capsys):
    from configs import QWEN2_STYLE_GATED_SHARED
    from deamoe_trt import DeaMoEStack

    src = DeaMoEStack.random(QWEN2_STYLE_GATED_SHARED, 1, seed=1).save_pretrained(tmp_path / "src")
    out = tmp_path / "out"
    argv = ["convert", str(src), "-o", str(out), "--departments", "4", "--shared-size", "8"]
    argv += ["--top-departments", "2", "--calibration-tokens", "128", "--no-compare"]
    assert _exit_code(argv) == 0
    first = _snapshot(out)
    capsys.readouterr()
    assert _exit_code(argv) == 0  # the rerun replaces what the first run wrote
    assert f"note: replaced what was in {out}" in capsys.readouterr().err
    assert _snapshot(out) == first  # the same seed gives the same files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


@pytest.mark.slow  # a subprocess
def test_sigterm_while_writing_removes_the_temporary_files(tmp_path):
    import signal
    import subprocess
    import textwrap
    import time

    # A writer stopped inside its atomic write: SIGTERM unwinds it like Ctrl-C.
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from deamoe_trt._io import atomic_path
        from deamoe_trt.cli.main import main
        import deamoe_trt.layer as layer

        def slow(directory, tensors, header):
            with atomic_path(Path(directory) / "model.safetensors") as tmp:
                tmp.write_bytes(b"partial")
                print("writing", flush=True)
                time.sleep(60)

        layer.write_files = slow
        sys.exit(main(["init", "-o", {str(tmp_path / "ckpt")!r}]))
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130 and err.strip() == "deamoe-trt init: interrupted"
    assert list(tmp_path.iterdir()) == []  # neither the staging folder nor its temporary stayed
