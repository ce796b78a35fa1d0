"""`deamoe-trt bench --quantized`: every contender checked against its reference, bytes from routing."""

import json

import pytest

from deamoe_trt.cli.main import main

try:
    from deamoe_trt import cpu

    cpu.load()
except Exception as exc:
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)


@pytest.mark.slow
def test_quick_quantized_bench_checks_and_counts(tmp_path, capsys):
    out = tmp_path / "q.json"
    assert main(["bench", "--quick", "--quantized", "4", "--tokens", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vs QMoE vanilla" in text and "Targets, int4 DeaMoE at 1 token" in text
    result = json.loads(out.read_text())
    names = [c["name"] for c in result["contenders"]]
    assert names[0] == "DeaMoE int4, CPU kernel" and "vanilla MoE int4, ONNX Runtime QMoE (anchor)" in names
    assert not any(c.get("warning") for c in result["contenders"])
    rows = {r["contender"]: r for r in result["results"]}
    # tiny, int4, group 16, fp32 scales and router, 1 token: 2 departments x 3*64*32 and 4 experts
    # x 3*64*16 weights at 0.5 B + 4 B per 16, plus the 16 x 64 fp32 router.
    weights = 2 * 3 * 64 * 32 + 4 * 3 * 64 * 16
    assert rows["DeaMoE int4, CPU kernel"]["bytes_per_step_mean"] == weights // 2 + weights // 16 * 4 + 16 * 64 * 4
    assert rows["DeaMoE fp32, CPU kernel"]["bytes_per_step_mean"] == weights * 4 + 16 * 64 * 4


def test_group_size_without_quantized_is_refused(capsys):
    assert main(["bench", "--quick", "--group-size", "64"]) == 2
    assert "--group-size goes with --quantized" in capsys.readouterr().err
