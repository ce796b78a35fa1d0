"""A killed `train`, rerun with the same arguments, takes the models it had finished from
OUTPUT.work, continues the unfinished one from its last checkpoint and writes the weights an
uninterrupted run writes; the finished run leaves no work folder. The same under two gloo
processes, data parallel and sharded."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.multiprocessing as mp
from safetensors import safe_open

from deamoe_trt.cli.main import main
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.train import lm
from deamoe_trt.train.compare import get_preset

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 6  # the micro preset's models: a checkpoint after every step
GROUPS = 2  # a step asks lm._lr once per AdamW parameter group (decayed, not decayed)
ARGS = ["train", "--preset", "micro", "--steps", str(STEPS)]


def stepping(monkeypatch, stop_at: int | None = None) -> list[int]:
    """The steps taken (every model's, in order); the step number stop_at (from 0, over all
    models) is interrupted as Ctrl-C would (the CLI exits 130)."""
    taken: list[int] = []
    calls, lr = [0], lm._lr

    def counted(step, settings):
        calls[0] += 1
        if calls[0] % GROUPS == 1:  # a step's first call
            if len(taken) == stop_at:
                raise KeyboardInterrupt
            taken.append(step)
        return lr(step, settings)

    monkeypatch.setattr(lm, "_lr", counted)
    return taken


def weights(folder, names) -> dict[str, dict[str, torch.Tensor]]:
    return {name: DeaMoELM.from_pretrained(folder / name).state_dict() for name in names}


def assert_same(resumed: dict, whole: dict, atol: float = 0.0) -> None:
    assert resumed.keys() == whole.keys()
    for name, state in whole.items():
        assert resumed[name].keys() == state.keys()
        for key, tensor in state.items():
            torch.testing.assert_close(resumed[name][key], tensor, rtol=0, atol=atol, msg=f"{name} {key}")


def rows(folder) -> list[dict]:
    report = json.loads((folder / "report.json").read_text())
    return [{k: v for k, v in row.items() if k != "seconds"} for row in report["rows"]]


@pytest.mark.slow  # three runs of five micro models
def test_a_killed_train_resumes_and_writes_the_uninterrupted_weights(tmp_path, monkeypatch, capsys):
    args = [*ARGS, "--upcycle"]  # five models: deamoe, vanilla (6 steps), dense (2), both upcycled (4)
    names = ("deamoe", "vanilla", "dense", "deamoe-upcycled", "vanilla-upcycled")
    whole = tmp_path / "whole"
    with monkeypatch.context() as patch:
        uninterrupted = stepping(patch)
        assert main([*args, "-o", str(whole)]) == 0
    assert len(uninterrupted) == 2 * STEPS + 2 + 2 * 4
    assert not (tmp_path / "whole.work").exists()

    out, work = tmp_path / "t", tmp_path / "t.work"
    with monkeypatch.context() as patch:
        stepping(patch, stop_at=STEPS + 4)  # killed before the vanilla model's fifth step
        assert main([*args, "-o", str(out)]) == 130
    assert not out.exists()
    assert (work / "deamoe.safetensors").is_file()  # the finished model
    with safe_open(str(work / "vanilla.checkpoint.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["training"])["step"] == 4

    with monkeypatch.context() as patch:
        taken = stepping(patch)
        capsys.readouterr()
        assert main([*args, "-o", str(out)]) == 0
    assert taken == uninterrupted[STEPS + 4 :]  # nothing done twice
    assert f"train: resuming from the finished work in {work}" in capsys.readouterr().err
    assert not work.exists()
    assert_same(weights(out, names), weights(whole, names))
    assert rows(out) == rows(whole)
    start = DeaMoELM.random(get_preset("micro").config, seed=0).state_dict()
    trained = weights(whole, ["deamoe"])["deamoe"]
    assert max(float((trained[k] - start[k]).abs().max()) for k in start) > 1e-3  # training moved the weights


def test_work_of_other_arguments_is_set_aside_and_the_run_starts_over(tmp_path, monkeypatch, capsys):
    out, work = tmp_path / "t", tmp_path / "t.work"
    with monkeypatch.context() as patch:
        stepping(patch, stop_at=STEPS + 2)
        assert main([*ARGS, "--seed", "1", "-o", str(out)]) == 130
    assert (work / "deamoe.safetensors").is_file()
    with monkeypatch.context() as patch:
        taken = stepping(patch)
        capsys.readouterr()
        assert main([*ARGS, "-o", str(out)]) == 0
    assert taken == [*range(STEPS), *range(STEPS)]  # both models trained from their first step
    assert f"train: note: {work} holds another training comparison's work" in capsys.readouterr().err
    assert not work.exists()
    assert main([*ARGS, "-o", str(tmp_path / "whole"), "--force"]) == 0
    assert_same(weights(out, ["deamoe", "vanilla"]), weights(tmp_path / "whole", ["deamoe", "vanilla"]))


def _worker(rank: int, size: int, rendezvous: str, out: str, fsdp: bool, stop_at: int | None) -> None:
    import torch.distributed as dist

    from deamoe_trt.train.compare import run_comparison

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    try:
        with pytest.MonkeyPatch.context() as patch:
            stepping(patch, stop_at)
            with contextlib.suppress(KeyboardInterrupt):  # the stopped run: both processes stop at one step
                run_comparison(out, preset_name="micro", steps=STEPS, fsdp=fsdp)
        dist.barrier()  # both ranks leave together (see tests/convert/test_distill.py)
    finally:
        dist.destroy_process_group()


def spawn(tmp_path, run: str, out, fsdp: bool, stop_at: int | None = None) -> None:
    rendezvous = str(tmp_path / f"rendezvous-{run}")
    mp.spawn(_worker, args=(2, rendezvous, str(out), fsdp, stop_at), nprocs=2, join=True)


@pytest.mark.slow  # three runs of two processes
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_processes_killed_and_resumed_write_the_uninterrupted_weights(tmp_path, kind):
    fsdp, names = kind == "fsdp", ("deamoe", "vanilla")
    spawn(tmp_path, "whole", tmp_path / "whole", fsdp)
    out, work = tmp_path / "t", tmp_path / "t.work"
    spawn(tmp_path, "stopped", out, fsdp, stop_at=STEPS + 3)
    assert not out.exists() and (work / "vanilla.checkpoint.safetensors").is_file()
    spawn(tmp_path, "resumed", out, fsdp)
    assert not work.exists()
    assert json.loads((out / "report.json").read_text())["settings"]["processes"] == 2
    assert_same(weights(out, names), weights(tmp_path / "whole", names), atol=1e-6)


@pytest.mark.slow  # three runs of tiny-lm
def test_a_killed_train_tiny_resumes_and_writes_the_uninterrupted_weights(tmp_path, monkeypatch, capsys):
    args = ["train-tiny", "--quick", "--steps", str(STEPS)]
    with monkeypatch.context() as patch:
        uninterrupted = stepping(patch)
        assert main([*args, "-o", str(tmp_path / "whole")]) == 0
    out, work = tmp_path / "t", tmp_path / "t.work"
    with monkeypatch.context() as patch:
        stepping(patch, stop_at=3)
        assert main([*args, "-o", str(out)]) == 130
    assert not out.exists() and (work / "checkpoint.safetensors").is_file()
    with monkeypatch.context() as patch:
        taken = stepping(patch)
        capsys.readouterr()
        assert main([*args, "-o", str(out)]) == 0
    assert taken == uninterrupted[3:] == [3, 4, 5]
    assert f"train-tiny: resuming from the finished work in {work}" in capsys.readouterr().err
    assert not work.exists()
    resumed, whole = (DeaMoELM.from_pretrained(p).state_dict() for p in (out, tmp_path / "whole"))
    assert_same({"tiny": resumed}, {"tiny": whole})
