"""scripts/device_lm_check.py end to end on the SIMT-emulated kernels with a micro model: every
twin in bfloat16 and int4 at one and two sequences a step (bfloat16 also with the projections on
the kernels' GEMV), the transformers peer where transformers is installed, JSON and markdown
written; without a GPU the GPU run exits 2."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_lm_check.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("device_lm_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_lm_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_emulated_tiny_run_times_every_twin_and_writes_its_table(script, emulated_lib, tmp_path, one_thread):
    argv = ["--out", str(tmp_path), "--tiny", "--emulated", "--library", emulated_lib._name, "--blocks", "1"]
    argv += ["--steps", "1", "--sequences", "1,2", "--no-compile", "--budget-s", "900"]
    assert script.main(argv) == 0
    result = json.loads((tmp_path / "lm_check.json").read_text())
    ours = [r for r in result["rows"] if r["contender"].startswith("deamoe-trt")]
    assert {(r["twin"], r["weights"], r["sequences"]) for r in ours} == {
        (t, w, n) for t in ("deamoe", "expanded", "vanilla") for w in ("bf16", "int4") for n in (1, 2)
    }
    assert not result["errors"]
    for r in ours:
        assert r["tpot_ms"] > 0 and r["bytes_per_step"] > 0
    # Two sequences read at least the weights one does, and the int4 FFNs fewer bytes than bf16's.
    gemv = [r for r in ours if "GEMV" in r["contender"]]
    assert {(r["twin"], r["sequences"]) for r in gemv} == {(t, n) for t in ("deamoe", "vanilla") for n in (1, 2)}
    bytes_of = {(r["twin"], r["weights"], r["sequences"]): r["bytes_per_step"] for r in ours if r not in gemv}
    for t in ("deamoe", "expanded", "vanilla"):
        assert bytes_of[(t, "bf16", 2)] >= bytes_of[(t, "bf16", 1)] > bytes_of[(t, "int4", 1)]
    peers = [r for r in result["rows"] if r["contender"].startswith("transformers")]
    if importlib.util.find_spec("transformers") is not None:
        assert [r["sequences"] for r in peers] == [1, 2]
    table = (tmp_path / "lm_check.md").read_text()
    assert "| deamoe-trt CUDA (deamoe) | int4 | 2 |" in table and result["commit"] in table


def test_without_a_gpu_the_gpu_run_exits_2(script, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert script.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "lm_check.json").exists()
