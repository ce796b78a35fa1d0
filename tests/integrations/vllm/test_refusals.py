"""What vLLM cannot serve is refused in one line when vLLM reads the model directory, before an
engine starts: a head_dim the platform's attention lacks, an untested vLLM version, a feature
the plugin does not implement (also in a config.json edited by hand)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.vllm.checks import check_vllm_version
from deamoe_trt.integrations.vllm.export import write_lm_dir
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.lm.tokenizer import ByteTokenizer

from .conftest import CPU_MEMORY_FRACTION, ROOT, TINY_LM, vllm_or_skip

vllm = vllm_or_skip()


def model_dir(tmp_path, name: str, **changes):
    config = load_lm(TINY_LM).model.config.replace(**changes)
    return write_lm_dir(DeaMoELM.random(config), ByteTokenizer(), tmp_path / name)


def refusal(directory) -> str:
    with pytest.raises(UsageError) as info:
        vllm.LLM(str(directory), dtype="float32", enforce_eager=True, gpu_memory_utilization=CPU_MEMORY_FRACTION)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_head_dim_the_cpu_attention_lacks_is_refused_before_the_engine_starts(tmp_path):
    message = refusal(model_dir(tmp_path, "hd16", head_dim=16))
    assert message.startswith("head_dim 16 is not supported by vLLM's CPU attention (it has 32, 64")


def test_a_vllm_version_outside_the_tested_range_is_refused(tmp_path, monkeypatch):
    directory = model_dir(tmp_path, "ok")
    monkeypatch.setattr(vllm, "__version__", "0.31.4")
    assert "vLLM 0.31.4 is outside the versions" in refusal(directory)
    with pytest.raises(UsageError, match=r"vLLM 1\.0\.0 is outside .*0\.32\.x"):
        check_vllm_version("1.0.0")


def test_a_hand_edited_config_with_an_unserved_feature_is_refused(tmp_path):
    directory = model_dir(tmp_path, "edited")
    path = directory / "config.json"
    data = json.loads(path.read_text())
    data["deamoe_lm"]["moe"].update(activation="swiglu_clamped", swiglu_alpha=1.5)
    path.write_text(json.dumps(data))
    assert refusal(directory).startswith("the clamped SwiGLU with alpha 1.5 and limit 7.0 is not served")


@pytest.mark.slow
def test_the_launcher_refuses_in_one_line_with_exit_2(tmp_path):
    directory = model_dir(tmp_path, "hd16", head_dim=16)
    run = subprocess.run(
        [sys.executable, "-m", "deamoe_trt.integrations.vllm.serve", str(directory), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2
    assert last.startswith("deamoe_trt.integrations.vllm.serve: error: head_dim 16 is not supported"), run.stderr[
        -2000:
    ]
