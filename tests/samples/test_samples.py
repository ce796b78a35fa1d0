import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deamoe_trt.lm import load_lm
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.trt._tensorrt import has_tensorrt

pytestmark = pytest.mark.slow  # runs the samples in subprocesses and compiles the C++ one

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
SHIPPED = TINY_LM


def run(script, *args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SAMPLES / "python" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def test_shipped_checkpoint_is_small_and_trained():
    size = sum(p.stat().st_size for p in SHIPPED.iterdir())
    assert size < 5_000_000
    loaded = load_lm(SHIPPED)
    assert loaded.training["val_loss"] < 1.5 < loaded.training["initial_val_loss"]


def test_generate_ort_quick_runs_end_to_end():
    result = run("generate_ort.py", "--quick")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("same tokens as PyTorch greedy") == 2
    assert "TPOT ms" in result.stdout and "expanded twin TPOT / DeaMoE TPOT" in result.stdout


def test_generate_ort_bad_prompt_is_one_line():
    result = run("generate_ort.py", "--quick", "--prompt", "\u00e9t\u00e9")
    assert result.returncode == 2
    assert result.stderr.startswith("generate_ort.py: error: the prompt has") and "Traceback" not in result.stderr


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed here")
def test_generate_trt_says_clearly_that_tensorrt_is_missing():
    result = run("generate_trt.py", "--quick")
    assert result.returncode == 1
    assert "TensorRT is not installed" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(
    not os.environ.get("DEAMOE_TRT_INCLUDE") or not shutil.which("g++"),
    reason="set DEAMOE_TRT_INCLUDE (TensorRT include/) and optionally CUDA_INCLUDE to compile-check the C++ sample",
)
def test_cpp_sample_compiles(tmp_path):
    cuda = os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")
    result = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-c",
            str(SAMPLES / "cpp" / "tiny_lm_trt.cpp"),
            "-isystem",
            os.environ["DEAMOE_TRT_INCLUDE"],
            "-isystem",
            cuda,
            "-o",
            str(tmp_path / "tiny_lm_trt.o"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_quantized_lm_reports_perplexity_and_tpot_per_bit_width(tmp_path):
    from deamoe_trt.lm import load_lm
    from deamoe_trt.quant import QuantConfig

    result = run("quantized_lm.py", "--rounds", "1", "--new-tokens", "8", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    # The measured models went through their checkpoints, which load as quantized models.
    for bits in (8, 4):
        assert load_lm(tmp_path / f"tiny-lm-int{bits}").model.config.quantization == QuantConfig(bits, 32)
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.startswith(("fp32", "int"))}
    assert set(rows) == {"fp32", "int8,", "int4,"}
    perplexity = {name: float(row[-4]) for name, row in rows.items()}
    # The shipped model's held-out loss is 1.274 nats per byte; int8 barely moves it, int4 a little.
    assert perplexity["fp32"] == pytest.approx(3.58, abs=0.01)
    assert perplexity["fp32"] <= perplexity["int8,"] + 0.01 and perplexity["int8,"] <= perplexity["int4,"] + 0.01
    assert perplexity["int4,"] < perplexity["fp32"] * 1.05
