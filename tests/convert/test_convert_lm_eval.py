"""`convert --lm-eval`: lm-evaluation-harness's local tasks on the source and the converted
model land in the report; a layer source is refused before any conversion."""

from __future__ import annotations

import json
import math

import pytest

from deamoe_trt.cli.main import main
from deamoe_trt.hf.lm_eval_task import CHOICE_TASK, TASK
from deamoe_trt.layer import DeaMoEStack
from deamoe_trt.lm import DeaMoELM

from .test_convert_lm import VANILLA

ARGS = ["--departments", "2", "--shared-fraction", "0.5", "--top-departments", "1", "--no-compare"]


@pytest.mark.slow  # the harness and transformers load, four evaluations
def test_the_report_holds_both_tasks_for_the_source_and_the_converted_model(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)
    src = DeaMoELM.random(VANILLA, seed=5).save_pretrained(tmp_path / "src")
    report = tmp_path / "r.json"
    argv = ["convert", str(src), *ARGS, "-o", str(tmp_path / "out"), "--report", str(report), "--lm-eval", "8"]
    assert main(argv) == 0
    lm_eval = json.loads(report.read_text())["lm_eval"]
    assert lm_eval["limit"] == 8 and set(lm_eval["results"]) == {"source", "converted"}
    for tasks in lm_eval["results"].values():
        assert math.isfinite(tasks[TASK]["token_perplexity"]) and tasks[TASK]["token_perplexity"] > 1
        assert 0 <= tasks[CHOICE_TASK]["acc"] <= 1
    source, converted = (lm_eval["results"][n][TASK]["token_perplexity"] for n in ("source", "converted"))
    assert source != converted  # two models were evaluated, not one twice


def test_a_layer_source_is_refused_in_one_line_before_converting(tmp_path, capsys):
    src = tmp_path / "layer"
    DeaMoEStack.random(VANILLA.moe, 1, seed=0).save_pretrained(src)
    assert main(["convert", str(src), *ARGS, "-o", str(tmp_path / "out"), "--lm-eval"]) == 2
    err = capsys.readouterr().err
    assert "--lm-eval evaluates language models" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
