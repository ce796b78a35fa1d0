"""The whole pipeline on an OLMoE-1B-7B-shaped checkpoint of one block (real widths), each
step's peak RSS within the bounds docs/scale.md states."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deamoe_trt.bench import synth
from deamoe_trt.export import EXTERNAL_DATA_THRESHOLD

ROOT = Path(__file__).resolve().parents[2]
GB = 10**9


def bounds(model_bytes: int, block_bytes: int, quantized_bytes: int, export_bytes: int) -> dict[str, int]:
    """Peak RSS per step (bytes); docs/scale.md's table. S = the checkpoint, B = its largest
    block, Q = the int4 checkpoint, E = its export (model and external data)."""
    s, b, q, e = model_bytes, block_bytes, quantized_bytes, export_bytes
    # An export under protobuf's limit keeps its weights inline: the graph holds and
    # serializes them, and ONNX Runtime parses them before it copies them.
    inline = e <= EXTERNAL_DATA_THRESHOLD
    return {
        "synth": 1 * GB,  # a chunk at a time
        "import-hf": b + 1 * GB,  # a block at a time
        "convert": 7 * b + 1 * GB,  # a block and its conversion, whatever the depth
        "quantize": 2 * b + 1 * GB,  # a tensor at a time
        "export-lm": q + (7 * e // 2 + 1 * GB if inline else 2 * GB),  # the int4 model; weights to disk as made
        "generate-ort": (3 * e if inline else e) + 1 * GB,  # the export, in ONNX Runtime only
        "generate-cpu": 3 * s // 2 + 1 * GB,
    }


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/time").is_file(), reason="needs GNU time for peak RSS")
def test_pipeline_at_real_width_stays_within_its_memory_bounds(tmp_path):
    if shutil.disk_usage(tmp_path).free < 12 * GB:
        pytest.skip("needs 12 GB of free disk")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        ["bash", str(ROOT / "scripts/scale_pipeline.sh"), "olmoe-1b-7b", "1", str(tmp_path)], check=True, env=env
    )
    steps = {row["step"]: row for row in csv.DictReader((tmp_path / "steps.tsv").open(), delimiter="\t")}
    specs = synth.tensor_specs(synth.with_layers(synth.read_config("olmoe-1b-7b"), 1))
    block = sum(s.nbytes for s in specs if s.name.startswith("model.layers.0."))
    model = sum(s.nbytes for s in specs)
    quantized, exported = (int(steps[step]["bytes"]) for step in ("quantize", "export-lm"))
    assert exported > quantized > 0  # the export's external data counted
    for step, bound in bounds(model, block, quantized, exported).items():
        assert int(steps[step]["peak_rss_kb"]) * 1024 <= bound, (step, steps[step]["peak_rss_kb"])
    texts = [(tmp_path / f"generate-{r}.log").read_text().splitlines()[1] for r in ("ort", "cpu")]
    assert texts[0] == texts[1]  # greedy: the same tokens on ONNX Runtime and the CPU kernel
