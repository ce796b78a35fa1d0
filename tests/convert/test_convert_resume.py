"""A killed `convert` with baselines and healing resumes from OUTPUT.work: the same files, no
finished piece computed twice."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from configs import MICRO_LM
from deamoe_trt.cli.main import main as cli
from deamoe_trt.convert import baselines, distill, run
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.train.lm import shipped_text

VANILLA = MICRO_LM.replace(
    moe=MICRO_LM.moe.replace(
        num_departments=1, experts_per_department=4, shared_intermediate_size=0, private_intermediate_size=24
    )
)


class Killed(BaseException):
    """Stands for a kill: nothing in the command catches it."""


@pytest.fixture
def counted(monkeypatch):
    """Counts of the expensive pieces: per-layer conversions, baseline sets, layer-wise healings,
    end-to-end healing steps and healing checkpoints; kill_at[0] = the checkpoint after which to die."""
    calls: Counter[str] = Counter()
    kill_at = [math.inf]

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(run, "convert_layer", counting("convert_layer", run.convert_layer))
    monkeypatch.setattr(baselines, "build", counting("baselines", baselines.build))
    monkeypatch.setattr(run, "heal_layer", counting("heal_layer", run.heal_layer))
    monkeypatch.setattr(distill, "cosine_lr", counting("heal_step", distill.cosine_lr))
    save = distill.save_checkpoint

    def save_then_maybe_die(*args, **kwargs):
        path = save(*args, **kwargs)
        calls["checkpoint"] += 1
        if calls["checkpoint"] >= kill_at[0]:
            raise Killed
        return path

    monkeypatch.setattr(distill, "save_checkpoint", save_then_maybe_die)
    return calls, kill_at


def _argv(src, out, text, *extra):
    return [
        "convert",
        str(src),
        "-o",
        str(out),
        "--departments",
        "2",
        "--shared-fraction",
        "0.5",
        "--top-departments",
        "1",
        "--calibration",
        str(text),
        "--heldout-windows",
        "2",
        "--heal-steps",
        "4",
        "--report",
        f"{out}.json",
        *extra,
    ]


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def source(tmp_path):
    src = DeaMoELM.random(VANILLA, seed=5).eval().save_pretrained(tmp_path / "src")
    text = tmp_path / "calibration.txt"
    text.write_text(shipped_text()[:12000])
    return src, text


@pytest.mark.slow
def test_a_convert_killed_while_healing_resumes_with_identical_files_and_no_repeated_work(
    source, tmp_path, counted, capsys
):
    calls, kill_at = counted
    src, text = source
    whole = tmp_path / "whole"
    assert cli(_argv(src, whole, text)) == 0
    full = Counter(calls)
    assert full["baselines"] == 1 and full["heal_step"] >= 3 * 4  # the converted model and two baselines healed
    assert not (tmp_path / "whole.work").exists()

    calls.clear()
    kill_at[0] = math.ceil(0.6 * full["checkpoint"])
    resumed = tmp_path / "resumed"
    with pytest.raises(Killed):
        cli(_argv(src, resumed, text))
    first = Counter(calls)
    assert not resumed.exists() and (tmp_path / "resumed.work").is_dir()

    calls.clear()
    capsys.readouterr()
    assert cli(_argv(src, resumed, text)) == 0
    assert "resuming from the finished work" in capsys.readouterr().err
    second = Counter(calls)
    # Nothing finished before the kill is computed again: the two runs together do the work of one.
    for piece in ("convert_layer", "baselines", "heal_layer", "heal_step"):
        assert first[piece] + second[piece] == full[piece], piece
    assert second["convert_layer"] == second["baselines"] == 0
    assert _files(resumed) == _files(whole)
    assert (tmp_path / "resumed.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
    assert not (tmp_path / "resumed.work").exists()


@pytest.mark.slow
def test_the_work_of_other_arguments_is_set_aside_with_a_note(source, tmp_path, counted, capsys):
    calls, kill_at = counted
    src, text = source
    out = tmp_path / "out"
    kill_at[0] = 1
    with pytest.raises(Killed):
        cli(_argv(src, out, text))
    first = Counter(calls)
    calls.clear()
    kill_at[0] = math.inf
    capsys.readouterr()
    assert cli(_argv(src, out, text, "--heal-lr", "0.002")) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "another conversion's work" in line]
    assert len(notes) == 1 and "starting over" in notes[0]
    assert calls["convert_layer"] == first["convert_layer"] and calls["baselines"] == 1
    assert not (tmp_path / "out.work").exists()
