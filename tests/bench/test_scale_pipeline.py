"""scripts/scale_pipeline.sh, the whole pipeline from a synthetic checkpoint to greedy tokens.

- In the suite: an OLMoE-shaped model at reduced width (64 experts, top-8, the real vocabulary)
  with the shard size and the external-data threshold lowered, so that it takes the paths a
  real-sized model takes (a sharded checkpoint, block-by-block conversion of several blocks,
  the streamed quantize, an export with its weights in external data, ONNX Runtime reading it).
- At real width (marked scale: DEAMOE_SCALE_TESTS=1, as .ci/run's own step sets): one OLMoE-1B-7B block,
  each step's peak RSS within the bounds docs/scale.md states. Memory bounds only mean
  something where the model's bytes dwarf the interpreter's: at reduced width every bound
  would hold whatever the code held, so that check stays at real width, outside the suite.
"""

from __future__ import annotations

import csv
import json
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
STEPS = ["synth", "import-hf", "convert", "quantize", "export-lm", "generate-ort", "generate-cpu"]


def run_pipeline(config: str, layers: int, out: Path, **settings: str) -> dict[str, dict[str, str]]:
    """scripts/scale_pipeline.sh's steps.tsv rows by step."""
    env = {**os.environ, **settings, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script = ROOT / "scripts/scale_pipeline.sh"
    subprocess.run(["bash", str(script), config, str(layers), str(out)], check=True, env=env)
    with (out / "steps.tsv").open() as f:
        return {row["step"]: row for row in csv.DictReader(f, delimiter="\t")}


def greedy_texts(out: Path) -> list[str]:
    """The generated text of `generate --runtime ort` and `--runtime cpu`."""
    return [(out / f"generate-{r}.log").read_text().splitlines()[1] for r in ("ort", "cpu")]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/time").is_file(), reason="the script times each step with GNU time")
def test_pipeline_takes_the_large_model_paths_at_reduced_width_and_both_runtimes_agree(tmp_path):
    hf = synth.read_config("olmoe-1b-7b")
    hf.update(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf))
    out = tmp_path / "run"
    # About 130 MB in all, 26 MB per embedding: 30 MB shards make several; 1 MB of weights
    # sends the export's to external data, as 2 GB does at real size.
    steps = run_pipeline(
        str(config), 3, out, SHARD_GB="0.03", EXTERNAL_DATA_THRESHOLD=str(10**6), CALIBRATION_TOKENS="2048"
    )
    assert list(steps) == STEPS
    index = json.loads((out / "hf" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # the checkpoint is sharded
    log = (out / "convert.log").read_text()
    assert "block 3/3" in log and "converted block by block" in log
    onnx, data = out / "q4.onnx", out / "q4.onnx.data"
    assert data.is_file() and data.stat().st_size > 10**6 > onnx.stat().st_size  # weights outside the graph
    assert int(steps["export-lm"]["bytes"]) == onnx.stat().st_size + data.stat().st_size
    texts = greedy_texts(out)
    assert texts[0] and texts[0] == texts[1]  # greedy: the same tokens on ONNX Runtime and the CPU kernel


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
@pytest.mark.scale
@pytest.mark.skipif(not Path("/usr/bin/time").is_file(), reason="needs GNU time for peak RSS")
def test_pipeline_at_real_width_stays_within_its_memory_bounds(tmp_path):
    if shutil.disk_usage(tmp_path).free < 12 * GB:
        pytest.skip("needs 12 GB of free disk")
    steps = run_pipeline("olmoe-1b-7b", 1, tmp_path)
    specs = synth.tensor_specs(synth.with_layers(synth.read_config("olmoe-1b-7b"), 1))
    block = sum(s.nbytes for s in specs if s.name.startswith("model.layers.0."))
    model = sum(s.nbytes for s in specs)
    quantized, exported = (int(steps[step]["bytes"]) for step in ("quantize", "export-lm"))
    assert exported > quantized > 0  # the export's external data counted
    for step, bound in bounds(model, block, quantized, exported).items():
        assert int(steps[step]["peak_rss_kb"]) * 1024 <= bound, (step, steps[step]["peak_rss_kb"])
    texts = greedy_texts(tmp_path)
    assert texts[0] == texts[1]  # greedy: the same tokens on ONNX Runtime and the CPU kernel
