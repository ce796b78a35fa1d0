"""`import deamoe_trt` imports no transformers, and once transformers loads its auto classes they
know model_type "deamoe" (unless vLLM, which registers its own config class, is loaded)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # fresh interpreters

CHECK = """
import sys
{before}
import deamoe_trt
assert "transformers" not in sys.modules or {before!r}, "import deamoe_trt imported transformers"
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from deamoe_trt.hf.configuration import DeaMoEPretrainedConfig
print("deamoe" in CONFIG_MAPPING and CONFIG_MAPPING["deamoe"] is DeaMoEPretrainedConfig)
"""


@pytest.mark.parametrize("before", ["", "import transformers.models.auto.modeling_auto"])
def test_the_auto_classes_know_deamoe_whether_transformers_loads_before_or_after(before):
    run = subprocess.run([sys.executable, "-c", CHECK.format(before=before)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "True"


def test_with_vllm_loaded_the_model_type_is_left_to_it():
    fake_vllm = "import types; sys.modules['vllm'] = types.ModuleType('vllm')"
    run = subprocess.run([sys.executable, "-c", CHECK.format(before=fake_vllm)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "False"
