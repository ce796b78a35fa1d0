"""End-to-end healing: a resumed run ends where an uninterrupted one does, checkpoints of
another run are refused, and two processes on gloo give one process's result."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from deamoe_trt.convert.distill import DistillSettings, distill_lm
from deamoe_trt.errors import UsageError
from deamoe_trt.lm import ByteTokenizer, DeaMoELM

from .test_convert_lm import MICRO, TEXT, VANILLA


def models():
    """(source, student): a vanilla MoE LM and a DeaMoE LM to distil into, seeded."""
    return DeaMoELM.random(VANILLA, seed=5).eval(), DeaMoELM.random(MICRO, seed=1)


def windows() -> torch.Tensor:
    return torch.tensor(ByteTokenizer().encode(TEXT[:4000]))[: 30 * 33].reshape(30, 33)


def trained(student) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in student.state_dict().items() if ".mlp." in k}


class Interrupt(Exception):
    pass


class StopAfter:
    """A progress sink that interrupts the run after `steps` updates."""

    def __init__(self, steps: int):
        self.left = steps

    def update(self, message: str = "", step: int = 1) -> None:
        assert "tok/s" in message and "ETA" in message
        self.left -= step
        if self.left <= 0:
            raise Interrupt


def test_a_resumed_run_ends_bit_for_bit_where_an_uninterrupted_one_ends(tmp_path):
    source, student = models()
    settings = DistillSettings(steps=6, lr=3e-3, batch_size=4, seed=2)
    losses = distill_lm(student, source, windows(), settings)
    expected = trained(student)

    path = str(tmp_path / "heal.safetensors")
    resumable = DistillSettings(steps=6, lr=3e-3, batch_size=4, seed=2, checkpoint=path, checkpoint_every=2)
    source, student = models()
    with pytest.raises(Interrupt):
        distill_lm(student, source, windows(), resumable, progress=StopAfter(3))  # checkpoint at step 2
    assert Path(path).exists() and not list(tmp_path.glob(".*.tmp"))
    source, student = models()  # a fresh process: nothing but the checkpoint carries over
    resumed = distill_lm(student, source, windows(), resumable)
    assert resumed == losses
    for name, tensor in trained(student).items():
        assert torch.equal(tensor, expected[name]), name


def test_a_checkpoint_of_another_run_is_refused_in_one_line(tmp_path):
    path = str(tmp_path / "heal.safetensors")
    source, student = models()
    distill_lm(student, source, windows(), DistillSettings(steps=2, batch_size=4, checkpoint=path))
    source, student = models()
    other = DistillSettings(steps=2, batch_size=4, lr=5e-3, checkpoint=path)
    with pytest.raises(UsageError, match="is of another run") as info:
        distill_lm(student, source, windows(), other)
    assert "\n" not in str(info.value)
    Path(path).write_bytes(b"not safetensors")
    with pytest.raises(UsageError, match="unreadable"):
        distill_lm(student, source, windows(), other)


def _worker(rank: int, size: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    try:
        source, student = models()
        losses = distill_lm(student, source, windows(), DistillSettings(steps=4, lr=3e-3, batch_size=6, seed=2))
        if rank == 0:
            tensors = trained(student)
            tensors["losses"] = torch.tensor(losses)
            save_file({k: v.contiguous() for k, v in tensors.items()}, out)
        # Both ranks leave together: a rank that tears gloo down while its peer is still
        # working can abort in gloo's connection threads.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_heal_as_one_process_does(tmp_path):
    from safetensors.torch import load_file

    out = str(tmp_path / "two.safetensors")
    # A file rendezvous: no port to pick that another process could take meanwhile.
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous"), out), nprocs=2, join=True)
    two = load_file(out)
    source, student = models()
    losses = distill_lm(student, source, windows(), DistillSettings(steps=4, lr=3e-3, batch_size=6, seed=2))
    torch.testing.assert_close(two.pop("losses"), torch.tensor(losses), rtol=1e-5, atol=1e-6)
    one = trained(student)
    assert set(two) == set(one)
    moved = 0.0
    start = trained(models()[1])
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)
        moved = max(moved, float((tensor - start[name]).abs().max()))
    assert moved > 1e-3  # the comparison means something: healing changed the weights


def test_convert_writes_healing_checkpoints_and_a_rerun_on_them_gives_the_same_model(tmp_path):
    from deamoe_trt.cli.main import main as cli
    from deamoe_trt.lm import load_lm

    src = DeaMoELM.random(VANILLA, seed=5).save_pretrained(tmp_path / "src")
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    argv = ["convert", str(src), "--departments", "2", "--shared-fraction", "0.5", "--top-departments", "1"]
    argv += ["--no-compare", "--calibration", str(text), "--heal-steps", "3", "--heal-batch", "4"]
    argv += ["--heal-checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "2"]
    assert cli([*argv, "-o", str(tmp_path / "a")]) == 0
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["converted---healed-fs0.5000.safetensors"]
    assert cli([*argv, "-o", str(tmp_path / "b")]) == 0  # resumes at the last step: the same model
    ids = torch.tensor([ByteTokenizer().encode(TEXT[:40])])
    with torch.no_grad():
        a, b = (load_lm(tmp_path / n).model(ids).logits for n in ("a", "b"))
    assert torch.equal(a, b)
