"""Healing launched by accelerate on two CPU processes (gloo): data parallel (torchrun, as
`accelerate launch` starts it) and sharded (`accelerate launch --use_fsdp`), each stopped
after a checkpoint and rerun, ends where one uninterrupted process ends; `convert` under
FSDP writes a model that loads and gives the one-process conversion's logits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from deamoe_trt.convert.distill import DistillSettings, distill_lm

from .test_convert_lm import TEXT, VANILLA
from .test_distill import models, trained, windows

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow  # several interpreters
TESTS = Path(__file__).parents[1]
SCRIPT = Path(__file__).with_name("accelerate_heal.py")
LAUNCH = {
    "ddp": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"],
    "fsdp": [sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--num_processes", "2",
             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port"],
}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(kind: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), os.getcwd()])}
    command = [*LAUNCH[kind], str(free_port()), *argv]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_accelerate_processes_stopped_and_resumed_heal_as_one_process(tmp_path, kind):
    out, checkpoint = tmp_path / "two.safetensors", tmp_path / "heal.safetensors"
    argv = [str(SCRIPT), str(out), "--checkpoint", str(checkpoint)]
    stopped = launch(kind, [*argv, "--stop-after", "3"], tmp_path)
    assert stopped.returncode != 0 and not out.exists()
    with safe_open(str(checkpoint), "pt") as f:
        assert json.loads(f.metadata()["healing"])["step"] == 2  # written every 2 steps, stopped after 3
    resumed = launch(kind, argv, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"healed on 2 processes, MULTI_CPU, fsdp {kind == 'fsdp'}" in resumed.stdout

    source, student = models()
    losses = distill_lm(student, source, windows(), DistillSettings(steps=6, lr=3e-3, batch_size=6, seed=2))
    two, one, start = load_file(str(out)), trained(student), trained(models()[1])
    torch.testing.assert_close(two.pop("losses"), torch.tensor(losses), rtol=1e-5, atol=1e-6)
    assert set(two) == set(one)
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-3  # healing moved the weights


def test_convert_under_fsdp_writes_the_one_process_model(tmp_path):
    from deamoe_trt.cli.main import main as cli
    from deamoe_trt.lm import ByteTokenizer, DeaMoELM, load_lm

    src = DeaMoELM.random(VANILLA, seed=5).save_pretrained(tmp_path / "src")
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    argv = ["convert", str(src), "--departments", "2", "--shared-fraction", "0.5", "--top-departments", "1"]
    argv += ["--no-compare", "--calibration", str(text), "--heal-steps", "3", "--heal-batch", "4"]
    run = launch("fsdp", ["-m", "deamoe_trt", *argv, "-o", str(tmp_path / "two")], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert cli([*argv, "-o", str(tmp_path / "one")]) == 0
    ids = torch.tensor([ByteTokenizer().encode(TEXT[:40])])
    with torch.no_grad():
        one, two = (load_lm(tmp_path / n).model(ids).logits for n in ("one", "two"))
    torch.testing.assert_close(two, one, rtol=1e-4, atol=1e-4)
