"""A killed language-model AWQ `quantize`, rerun with the same arguments, takes the blocks it
had finished from OUTPUT.work and writes what an uninterrupted run writes."""

import pytest

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt.cli.main import main
from deamoe_trt.quantize import awq

pytestmark = pytest.mark.usefixtures("one_thread")  # AWQ's searches: many small matmuls


@pytest.fixture(scope="module")
def micro_lm(tmp_path_factory):
    from deamoe_trt.lm import DeaMoELM

    return DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=7).save_pretrained(tmp_path_factory.mktemp("lm") / "micro-lm")


def counting(monkeypatch, fail_at: int | None = None) -> dict[str, int]:
    """Count awq's two searches per block; the plan search number fail_at (from 0) is
    interrupted as Ctrl-C would (the CLI exits 130)."""
    calls = {"input scales": 0, "plan": 0}
    search_input_scales, search = awq.search_input_scales, awq.search

    def scales(*args, **kwargs):
        calls["input scales"] += 1
        return search_input_scales(*args, **kwargs)

    def plan(*args, **kwargs):
        if calls["plan"] == fail_at:
            raise KeyboardInterrupt
        calls["plan"] += 1
        return search(*args, **kwargs)

    monkeypatch.setattr(awq, "search_input_scales", scales)
    monkeypatch.setattr(awq, "search", plan)
    return calls


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.slow  # three AWQ runs, each with its held-out perplexities
def test_a_killed_awq_run_resumes_at_the_unfinished_block_and_writes_the_same_files(
    micro_lm, tmp_path, monkeypatch, capsys
):
    from deamoe_trt.lm import load_lm

    blocks = load_lm(micro_lm).model.moe_layers()
    assert len(blocks) >= 2
    args = ["--bits", "4", "--group-size", "16", "--method", "awq"]
    whole = tmp_path / "whole"
    assert main(["quantize", str(micro_lm), "-o", str(whole), *args]) == 0

    out = tmp_path / "q"
    work = tmp_path / "q.work"
    with monkeypatch.context() as patch:
        counting(patch, fail_at=1)  # killed in the second block's plan search
        assert main(["quantize", str(micro_lm), "-o", str(out), *args]) == 130
    assert not out.exists() and work.is_dir()

    with monkeypatch.context() as patch:
        calls = counting(patch)
        capsys.readouterr()
        assert main(["quantize", str(micro_lm), "-o", str(out), *args]) == 0
    # Every block's input scales and the first block's plan came from the work folder.
    assert calls == {"input scales": 0, "plan": len(blocks) - 1}
    assert f"quantize: resuming from the finished work in {work}" in capsys.readouterr().err
    assert files(out) == files(whole)
    assert not work.exists()  # gone once the output is in place


def test_work_of_other_arguments_is_set_aside_and_the_run_starts_over(micro_lm, tmp_path, monkeypatch, capsys):
    out = tmp_path / "q"
    work = tmp_path / "q.work"
    args = ["--bits", "4", "--group-size", "16", "--method", "awq"]
    with monkeypatch.context() as patch:
        counting(patch, fail_at=0)
        assert main(["quantize", str(micro_lm), "-o", str(out), *args]) == 130
    assert work.is_dir()
    with monkeypatch.context() as patch:
        calls = counting(patch, fail_at=0)
        capsys.readouterr()
        # int8: other settings, so every search runs again
        assert main(["quantize", str(micro_lm), "-o", str(out), "--bits", "8", *args[2:]]) == 130
    assert calls["input scales"] > 0
    assert "holds another quantization's work (other arguments); starting over" in capsys.readouterr().err
