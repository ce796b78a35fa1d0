"""`deamoe-trt convert` on a layer-stack checkpoint: the written stack, report and plot."""

from __future__ import annotations

import json

import pytest
import torch

from configs import QWEN2_STYLE_GATED_SHARED
from deamoe_trt import DeaMoEStack
from deamoe_trt.cli.main import main as cli

# A vanilla MoE (f_s = 0) with a gated shared expert, which the conversion must keep.
VANILLA = QWEN2_STYLE_GATED_SHARED


@pytest.mark.slow
def test_convert_stack_with_report_and_plot(tmp_path, capsys):
    source = DeaMoEStack.random(VANILLA, 2, seed=1)
    src = source.save_pretrained(tmp_path / "src")
    out, report, plot = tmp_path / "out", tmp_path / "r.json", tmp_path / "r.png"
    argv = [
        "convert",
        str(src),
        "-o",
        str(out),
        "--departments",
        "4",
        "--shared-size",
        "8",
        "--top-departments",
        "2",
        "--calibration-tokens",
        "256",
        "--heal-steps",
        "3",
        "--report",
        str(report),
        "--plot",
        str(plot),
    ]
    assert cli(argv) == 0
    converted = DeaMoEStack.from_pretrained(out)
    c = converted.config
    assert (len(converted.layers), c.num_departments, c.shared_intermediate_size, c.private_intermediate_size) == (
        2,
        4,
        8,
        8,
    )
    orders = json.loads((out / "config.json").read_text())["source"]["expert_order"]
    for layer, orig, order in zip(converted.layers, source.layers, orders, strict=True):
        assert torch.equal(layer.router.weight, orig.router.weight[torch.tensor(order)])
    rows = json.loads(report.read_text())["rows"]
    fractions = {r["shared_fraction"] for r in rows if r["method"] == "converted + healed"}
    assert fractions == {0.25, 0.5, 0.75}
    for layer, orig in zip(converted.layers, source.layers, strict=True):
        assert torch.equal(layer.shared_experts.gate, orig.shared_experts.gate)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "converted + healed" in capsys.readouterr().out
