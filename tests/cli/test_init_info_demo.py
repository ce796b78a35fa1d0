import subprocess
import sys

import pytest

from deamoe_trt import DeaMoEStack
from deamoe_trt.cli.main import main


def run_cli(*args):
    """Run the real console entry in a subprocess: exit codes and stderr as users see them."""
    return subprocess.run(
        [sys.executable, "-m", "deamoe_trt", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_init_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["init", "--preset", "tiny", "--layers", "2", "--dtype", "fp16", "-o", str(tmp_path / "c")]) == 0
    stack = DeaMoEStack.from_pretrained(tmp_path / "c")
    assert len(stack.layers) == 2
    assert str(stack.dtype) == "torch.float16"
    assert "wrote tiny" in capsys.readouterr().out


def test_info_prints_config_parameters_and_bytes_table(tmp_path, capsys):
    main(["init", "-o", str(tmp_path / "c")])
    assert main(["info", str(tmp_path / "c"), "--tokens", "1,4", "--samples", "4"]) == 0
    out = capsys.readouterr().out
    assert "Weights loaded per decoding step" in out
    assert "vs expanded" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]
    # One token of the tiny preset: 2 departments x 3*64*32*4 B + 4 experts x 3*64*16*4 B + router 16*64*4 B
    assert rows[0][3:5] == ["102.40", "KB"]
    assert len(rows) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["info", "/nonexistent/ckpt"], "no checkpoint at /nonexistent/ckpt"),
        (["init", "--preset", "huge", "-o", "x"], "invalid choice"),
        (["info", "x", "--tokens", "0,2"], "token counts must be integers >= 1"),
        (["frobnicate"], "invalid choice"),
    ],
)
@pytest.mark.slow
def test_bad_input_gets_one_line_and_exit_code_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]


@pytest.mark.slow
def test_demo_runs_the_main_job(tmp_path):
    result = run_cli("demo", "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Routing of random tokens" in out
    assert "Weights loaded per decoding step" in out
    for form in ("plugin", "ort", "onnx"):
        assert f"$ deamoe-trt validate {tmp_path}/tiny-{form}-" in out
        assert (tmp_path / f"tiny-{form}-{'fp16' if form == 'onnx' else 'fp32'}.onnx").is_file()
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench.png").is_file()
    assert "same tokens as deamoe" in out  # the expanded twin decodes the shipped LM identically
