"""`deamoe-trt train` under `accelerate launch --use_fsdp` on two CPU processes: both models
sharded over the processes end at one process's weights, and the saved models load."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from deamoe_trt.cli.main import main
from deamoe_trt.lm import DeaMoELM

pytest.importorskip("accelerate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_train_sharded_over_two_processes_saves_the_one_process_models(tmp_path):
    argv = ["train", "--preset", "micro", "--steps", "3"]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port()), "-m", "deamoe_trt"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*launch, *argv, "-o", str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert main([*argv, "-o", str(tmp_path / "one")]) == 0
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["settings"]["processes"] == 2
    for name in ("deamoe", "vanilla"):
        one = DeaMoELM.from_pretrained(tmp_path / "one" / name).state_dict()
        two = DeaMoELM.from_pretrained(tmp_path / "two" / name).state_dict()
        start = DeaMoELM.random(DeaMoELM.from_pretrained(tmp_path / "one" / name).config, seed=0).state_dict()
        assert one.keys() == two.keys()
        for key in one:
            torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5)
        assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-3  # training moved the weights
