"""DeaMoEForCausalLM trains under accelerate: two CPU processes (DDP over gloo, launched by
torchrun as `accelerate launch` does) end where one process on the whole batch ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from configs import MICRO_LM
from deamoe_trt.export.hf import write_hf_dir
from deamoe_trt.lm.model import DeaMoELM
from deamoe_trt.lm.tokenizer import default_tokenizer

pytest.importorskip("accelerate")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # three interpreters loading transformers
SCRIPT = Path(__file__).with_name("accelerate_train.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_train_to_the_one_process_weights(tmp_path):
    lm = DeaMoELM.random(MICRO_LM, seed=1)
    directory = write_hf_dir(lm, default_tokenizer(256), tmp_path / "hf")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    runs = [
        [sys.executable, str(SCRIPT), str(directory), str(one)],
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(SCRIPT), str(directory), str(two)],
    ]  # fmt: skip
    for argv in runs:
        run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    assert "saved 2" in run.stdout
    a, b = load_file(str(one)), load_file(str(two))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=0), name
    start = {"model." + k: v for k, v in lm.state_dict().items()}
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-2  # the steps moved the weights
