import json
import subprocess
import sys

import pytest

from deamoe_trt import DeaMoEStack
from deamoe_trt.cli.demo_cmd import BENCH_PRESET, _bench_summary
from deamoe_trt.cli.main import main


def run_cli(*args, timeout=300):
    """Run the real console entry in a subprocess: exit codes and stderr as users see them."""
    return subprocess.run(
        [sys.executable, "-m", "deamoe_trt", *args], capture_output=True, text=True, timeout=timeout, check=False
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
    # A couple of minutes on two idle cores; more on a loaded machine.
    result = run_cli("demo", "-o", str(tmp_path), timeout=900)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Routing of random tokens" in out
    assert "Weights loaded per decoding step" in out
    for form in ("plugin", "ort", "onnx"):
        assert f"$ deamoe-trt validate {tmp_path}/tiny-{form}-" in out
        assert (tmp_path / f"tiny-{form}-{'fp16' if form == 'onnx' else 'fp32'}.onnx").is_file()
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench.png").is_file()
    assert "same tokens as deamoe" in out  # the expanded twin decodes the shipped LM identically
    assert "what the tiny models can and cannot show" in out
    # The speed step runs a layer where bytes set the time, and reports what the run measured.
    layer = json.loads((tmp_path / "bench.json").read_text())["layer"]
    assert layer["preset"] == BENCH_PRESET
    assert layer["status"] == "ok", layer.get("reason")
    rows = {(r["contender"], r["tokens"]): r for r in layer["results"]}
    assert {name for name, _ in rows} == {"deamoe/cpu", "expanded/cpu"}
    for tokens in (1, 4):
        ours, twin = rows["deamoe/cpu", tokens], rows["expanded/cpu", tokens]
        assert ours["bytes_per_step_mean"] < twin["bytes_per_step_mean"]
        assert f"{tokens} token(s) per step: {ours['bytes_per_step_mean'] / 1e6:.1f} MB vs" in out


def _bench_row(contender, tokens, megabytes, ms):
    return {"contender": contender, "tokens": tokens, "bytes_per_step_mean": megabytes * 1e6, "median_s": ms / 1e3}


def test_demo_bench_summary_gives_bytes_saved_their_bound_and_the_measured_ratio(tmp_path):
    result = {
        "layer": {
            "status": "ok",
            "preset": "qwen3-30b-a3b-layer",
            "dtype": "fp16",
            "results": [_bench_row("deamoe/cpu", 1, 50.0, 3.0), _bench_row("expanded/cpu", 1, 80.0, 4.5)],
        }
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    text = _bench_summary(path)
    # 50 MB against 80 MB: 1 - 50/80 = 37.5% fewer bytes, a 1.6x bound; 4.5 ms / 3.0 ms = 1.5x measured.
    assert "1 token(s) per step: 50.0 MB vs 80.0 MB (38% fewer bytes, at most 1.60x faster)" in text
    assert "median 3.00 ms vs 4.50 ms (1.50x)" in text


def test_demo_bench_summary_says_why_when_the_layer_was_skipped(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"layer": {"status": "skipped", "reason": "needs 5.2 GB, 3.1 GB available"}}))
    assert _bench_summary(path) == "(benchmark skipped: needs 5.2 GB, 3.1 GB available)"


@pytest.mark.parametrize("keep", [False, True])
def test_demo_names_its_folder_only_when_the_folder_stays(tmp_path, capsys, monkeypatch, keep):
    import deamoe_trt.cli.demo_cmd as demo

    for step in ("_step", "_routing", "_converted"):
        monkeypatch.setattr(demo, step, lambda *args: None)
    monkeypatch.setattr(demo, "_bench_summary", lambda path: "")
    argv = ["demo", *(["-o", str(tmp_path / "kept")] if keep else [])]
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    if keep:
        assert last == f"demo finished; files in {tmp_path / 'kept'}"
    else:
        assert "files in" not in last and "-o DIR" in last
