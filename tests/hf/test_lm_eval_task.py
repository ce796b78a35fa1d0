"""lm-evaluation-harness on a DeaMoE model, offline, on the local held-out task: its perplexity is
the one deamoe-trt computes from its own model on the same documents."""

from __future__ import annotations

import json
import math

import pytest

from configs import MICRO_LM
from deamoe_trt.export.hf import write_hf_dir
from deamoe_trt.hf.lm_eval_task import (
    CHOICE_TASK,
    CHOICES,
    TASK,
    held_out_windows,
    task_accuracy,
    task_perplexity,
    write_choice_task,
    write_held_out_task,
)
from deamoe_trt.lm.model import DeaMoELM
from deamoe_trt.lm.tokenizer import default_tokenizer
from deamoe_trt.quantize.lm import held_out_loss

pytestmark = pytest.mark.slow  # the harness and transformers load: tens of seconds


def test_the_task_holds_held_out_windows_with_contexts_that_do_not_end_in_whitespace(tmp_path):
    tokenizer = default_tokenizer(256)
    folder = write_held_out_task(tmp_path / "task", tokenizer, seq_len=48)
    docs = [json.loads(line) for line in (folder / "held_out.jsonl").read_text().splitlines()]
    assert len(docs) == 128 and all(len(d["context"]) + len(d["continuation"]) == 49 for d in docs)
    assert all(not d["context"][-1].isspace() and d["tokens"] == len(d["continuation"]) for d in docs)
    assert sum(len(d["context"]) > 1 for d in docs) < len(docs) // 4
    # the windows are the project's: the perplexity is within a few contexts of held_out_loss's
    lm = DeaMoELM.random(MICRO_LM, seed=1).eval()
    ours = task_perplexity(lm, folder, tokenizer)
    assert abs(math.log(ours) - held_out_loss(lm, tokenizer)) < 0.02


def test_lm_eval_perplexity_equals_deamoe_trts_own(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    tokenizer = default_tokenizer(256)
    lm = DeaMoELM.random(MICRO_LM, seed=1).eval()
    directory = write_hf_dir(lm, tokenizer, tmp_path / "hf")
    folder = write_held_out_task(tmp_path / "task", tokenizer, seq_len=MICRO_LM.max_position_embeddings)
    results = lm_eval.simple_evaluate(
        model="hf",
        # the byte tokenizer has no special tokens; the harness needs a prefix id only for empty contexts
        model_args=f"pretrained={directory},dtype=float32,prefix_token_id=0",
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(folder)),
        batch_size=16,
        device="cpu",
    )
    harness = results["results"][TASK]["token_perplexity,none"]
    ours = task_perplexity(lm, folder, tokenizer)
    assert harness == pytest.approx(ours, rel=1e-4)


def test_the_continuation_task_offers_each_window_its_own_ending_among_others(tmp_path):
    tokenizer = default_tokenizer(256)
    folder = write_choice_task(tmp_path / "task", tokenizer, seq_len=48)
    docs = [json.loads(line) for line in (folder / "continuation.jsonl").read_text().splitlines()]
    windows = [tokenizer.decode(w) for w in held_out_windows(tokenizer, 48).tolist()]
    assert len(docs) == len(windows) == 128
    for doc, window in zip(docs, windows, strict=True):
        assert len(doc["choices"]) == CHOICES and len(set(doc["choices"])) == CHOICES
        assert doc["context"] + doc["choices"][doc["gold"]] == window and not doc["context"][-1].isspace()
    assert {d["gold"] for d in docs} == set(range(CHOICES))


def test_lm_eval_accuracy_on_the_continuation_task_equals_deamoe_trts_own(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    tokenizer = default_tokenizer(256)
    lm = DeaMoELM.random(MICRO_LM, seed=1).eval()
    directory = write_hf_dir(lm, tokenizer, tmp_path / "hf")
    folder = write_choice_task(tmp_path / "task", tokenizer, seq_len=MICRO_LM.max_position_embeddings - 1)
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={directory},dtype=float32,prefix_token_id=0",
        tasks=[CHOICE_TASK],
        task_manager=TaskManager(include_path=str(folder)),
        batch_size=16,
        device="cpu",
        limit=24,
    )
    assert results["results"][CHOICE_TASK]["acc,none"] == task_accuracy(lm, folder, tokenizer, limit=24)
