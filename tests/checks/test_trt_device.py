"""`deamoe-trt check-trt`: its arguments (one line, exit 2 for a bad one) and, on a machine
without TensorRT, a run that records why each device step cannot run and does not pass."""

import pytest
from cli_status import cli_main

from deamoe_trt.checks import trt_device


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tokens", "x"], "--tokens"),
        (["--tokens", "4,-1"], "--tokens"),
        (["--iterations", "0"], "--iterations"),
        (["--warmup", "many"], "--warmup"),
        (["--dtype", "fp8"], "--dtype"),
        (["--presets", "nope"], "unknown preset(s) nope"),
        (["--routes", "cuda"], "unknown route(s) cuda"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag_and_exit_2(tmp_path, capsys, argv, named):
    out = tmp_path / "out"
    assert cli_main(["check-trt", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "internal error" not in err
    assert not out.exists(), "nothing written before the arguments are checked"


def test_token_counts_are_sorted_and_deduplicated(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(trt_device, "run_check", lambda options: seen.append(options) or 0)
    assert cli_main(["check-trt", str(tmp_path), "--tokens", "8,1,8,2"]) == 0
    (args,) = seen
    assert args.tokens == [1, 2, 8] and args.presets == ["tiny", "qwen3-30b-a3b-layer"]
