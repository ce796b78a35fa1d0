"""`deamoe-trt check-gpu`: a bad argument is one line naming the flag, exit 2, and nothing is
written; good ones are parsed into their values (the twin of test_trt_device.py's)."""

import pytest
from cli_status import cli_main

from deamoe_trt.checks.gpu import run as gpu_run


def parsed(monkeypatch, argv: list[str]):
    """The options check-gpu hands its check for argv (the check itself not run)."""
    seen = []
    monkeypatch.setattr(gpu_run, "run_check", lambda options: seen.append(options) or 0)
    assert cli_main(["check-gpu", *argv]) == 0
    (options,) = seen
    return options


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tokens", "x"], "--tokens"),
        (["--tokens", "4,-1"], "--tokens"),
        (["--pdl-tokens", "1,y"], "--pdl-tokens"),
        (["--iters", "0"], "--iters"),
        (["--torch-iters", "some"], "--torch-iters"),
        (["--budget-s", "soon"], "--budget-s"),
        (["--bits", "4,3"], "--bits"),
        (["--presets", "nope"], "unknown preset(s) nope"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag_and_exit_2(tmp_path, capsys, argv, named):
    out = tmp_path / "out"
    assert cli_main(["check-gpu", "--out", str(out), "--dry-run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "internal error" not in err
    assert not out.exists(), "nothing written before the arguments are checked"


def test_a_positional_folder_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli_main(["check-gpu", str(out), "--tokens", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tokens" in err and not out.exists()


def test_an_out_that_is_a_file_is_refused_before_the_run(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert cli_main(["check-gpu", "--out", str(taken), "--dry-run"]) == 2
    assert "it is a file" in capsys.readouterr().err


def test_without_a_gpu_nothing_is_written(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "out"
    assert cli_main(["check-gpu", "--out", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not out.exists()


def test_values_are_parsed(tmp_path, monkeypatch):
    args = parsed(monkeypatch, ["--out", str(tmp_path), "--tokens", "1,4", "--bits", "0,8", "--presets", "tiny,tiny"])
    assert args.tokens == [1, 4] and args.bits == {0, 8} and args.presets == ["tiny"]
    assert args.pdl_tokens == [1, 4, 16] and args.iters == 40
    assert args.out == tmp_path
    defaults = parsed(monkeypatch, ["--out", str(tmp_path)])
    assert defaults.presets == ["tiny", "deepseek-v3-layer", "qwen3-30b-a3b-layer", "gpt-oss-20b-style"]
    assert defaults.bits == {0, 4, 8} and defaults.tokens == [1, 2, 4, 8, 16]
