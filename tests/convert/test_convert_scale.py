"""A wide layer converts within the memory budget (the Qwen3-30B-A3B-shaped run itself is
measured once, in docs/convert.md; this is the same code path on a smaller shape)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from deamoe_trt import DeaMoELayer
from deamoe_trt.config import DeaMoEConfig

# d > 512 so neuron matching goes through the projection, as for the real shape.
WIDE = DeaMoEConfig(
    hidden_size=1024,
    num_departments=1,
    experts_per_department=64,
    shared_intermediate_size=0,
    private_intermediate_size=256,
    top_k=8,
    top_departments=1,
    norm_topk_prob=True,
)

SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, torch
    from deamoe_trt.cli.main import main
    torch.set_num_threads(1)
    def peak():  # kilobytes on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    before = peak()
    code = main(["convert", sys.argv[1], "-o", sys.argv[2], "--departments", "8", "--shared-size", "128",
                 "--top-departments", "2", "--calibration-tokens", "512", "--no-compare"])
    print(json.dumps({"code": code, "before": before, "peak": peak()}))
    """
)


@pytest.mark.slow
def test_wide_layer_converts_in_under_three_times_its_memory(tmp_path):
    layer = DeaMoELayer.random(WIDE, seed=0)
    layer_bytes = sum(t.numel() * 4 for t in layer.state_dict().values())
    layer.save_pretrained(tmp_path / "src")
    del layer
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "src"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["code"] == 0
    assert "convert f_s=0.50 [8/8]" in result.stderr  # progress per department
    grown = measured["peak"] - measured["before"]
    print(f"layer {layer_bytes / 1e6:.0f} MB, conversion grew the process by {grown / 1e6:.0f} MB")
    assert grown < 3 * layer_bytes
    converted = DeaMoELayer.from_pretrained(tmp_path / "out")
    assert converted.config.shared_intermediate_size == 128 and converted.config.num_departments == 8
