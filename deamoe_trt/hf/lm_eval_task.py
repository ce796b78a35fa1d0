"""Local lm-evaluation-harness tasks: the held-out perplexity of the shipped text, and a
multiple-choice continuation task built from the same windows.

write_held_out_task(folder, tokenizer, seq_len) writes a task folder for
`lm_eval --include_path FOLDER --tasks deamoe_held_out` (or TaskManager(include_path=...)):
the windows deamoe_trt.quantize.lm.held_out_loss scores (deamoe_trt.train.lm.evaluate's
fixed windows of seq_len + 1 tokens of the last 10% of the shipped text), one document each:
its first token the context and the others the continuation (a window whose first characters
are whitespace takes them into the context too, as the harness would otherwise move them out
of it). The metric, token_perplexity, is exp of the mean negative log-likelihood per
continuation token: held_out_loss's perplexity, less the few predictions those contexts hold.
Nothing is downloaded: the documents are a JSON-lines file beside the task.

deamoe_continuation (write_choice_task): each held-out window's first characters are the
context and its last CHOICE_CHARS characters (and the whitespace before them, which a context
must not end in) the right continuation, among three wrong ones (the endings of the next three
windows), the right one at position window index mod 4; the metrics are lm-eval's acc (the
choice of highest log-likelihood) and acc_norm (per byte).
run_local_tasks runs both tasks with `lm_eval`'s Python API on models written by export-hf
(what `convert --lm-eval` reports for the source and the converted model).

The tokenizer must give one token per character (the byte tokenizer; the harness tokenizes
context and continuation apart).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from ..errors import UsageError
from ..lm.model import DeaMoELM
from ..lm.tokenizer import ByteTokenizer, Tokenizer

TASK = "deamoe_held_out"
CHOICE_TASK = "deamoe_continuation"
CHOICES = 4
CHOICE_CHARS = 16

_UTILS = '''"""Metric of the deamoe_held_out task (written by deamoe_trt.hf.lm_eval_task)."""

import math


def process_results(doc, results):
    loglikelihood, _ = results[0]
    return {"token_perplexity": (loglikelihood, doc["tokens"])}


def token_perplexity(items):
    return math.exp(-sum(ll for ll, _ in items) / sum(n for _, n in items))
'''

# DATA: the documents' file, filled in by write_held_out_task.
_YAML = """task: deamoe_held_out
dataset_path: json
dataset_kwargs:
  data_files:
    test: DATA
test_split: test
output_type: loglikelihood
doc_to_text: "{{context}}"
doc_to_target: "{{continuation}}"
target_delimiter: ""
process_results: !function utils.process_results
metric_list:
  - metric: token_perplexity
    aggregation: !function utils.token_perplexity
    higher_is_better: false
metadata:
  version: 1.0
"""


_CHOICE_YAML = """task: deamoe_continuation
dataset_path: json
dataset_kwargs:
  data_files:
    test: DATA
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def held_out_windows(tokenizer: Tokenizer, seq_len: int) -> torch.Tensor:
    """[W, seq_len + 1] token windows, those of held_out_loss at this seq_len."""
    from ..train.lm import TrainSettings, shipped_text, split_text, windows

    settings = dataclasses.replace(TrainSettings(), seq_len=seq_len)
    _, held_out = split_text(shipped_text(), tokenizer, settings.val_fraction)
    gen = torch.Generator().manual_seed(0x5EED)  # evaluate's
    chunks = []
    for _ in range(settings.eval_batches):
        x, y = windows(held_out, settings.batch_size, settings.seq_len, gen)
        chunks.append(torch.cat((x, y[:, -1:]), dim=1))
    return torch.cat(chunks)


def check_tokenizer(tokenizer: Tokenizer) -> None:
    """A one-line UsageError unless the local tasks can score text of this tokenizer."""
    if not isinstance(tokenizer, ByteTokenizer):
        raise UsageError(
            f"the local lm-eval tasks need the byte tokenizer (one token per character), not {tokenizer.describe()}"
        )


def write_held_out_task(folder: str | Path, tokenizer: Tokenizer, seq_len: int) -> Path:
    """Write the task folder (see the module docstring); returns it."""
    check_tokenizer(tokenizer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "held_out.jsonl"
    with data.open("w") as f:
        for window in held_out_windows(tokenizer, seq_len).tolist():
            text = tokenizer.decode(window)
            # The harness moves a context's trailing whitespace into the continuation.
            cut = next((i for i in range(1, len(text)) if not text[i - 1].isspace()), len(text))
            doc = {"context": text[:cut], "continuation": text[cut:], "tokens": len(text) - cut}
            f.write(json.dumps(doc) + "\n")
    (folder / "utils.py").write_text(_UTILS)
    (folder / f"{TASK}.yaml").write_text(_YAML.replace("DATA", json.dumps(str(data.resolve()))))
    return folder


@torch.no_grad()
def task_perplexity(model: DeaMoELM, folder: str | Path, tokenizer: Tokenizer) -> float:
    """The task's token_perplexity computed by deamoe-trt's own model, without the harness: what
    `lm_eval --tasks deamoe_held_out` reports for the same model."""
    total, count = 0.0, 0
    for line in (Path(folder) / "held_out.jsonl").read_text().splitlines():
        doc = json.loads(line)
        ids = torch.tensor([tokenizer.encode(doc["context"] + doc["continuation"], what="the task's text")])
        log_probs = torch.log_softmax(model(ids[:, :-1]).logits.double(), dim=-1)[0]
        start = ids.shape[1] - doc["tokens"]
        targets = ids[0, start:]
        total += log_probs[start - 1 :].gather(-1, targets[:, None]).sum().item()
        count += doc["tokens"]
    return math.exp(-total / count)


def write_choice_task(folder: str | Path, tokenizer: Tokenizer, seq_len: int) -> Path:
    """Write the multiple-choice task (see the module docstring) into folder; returns it."""
    check_tokenizer(tokenizer)
    if seq_len <= CHOICE_CHARS:
        raise UsageError(f"the continuation task needs windows longer than {CHOICE_CHARS} tokens, got {seq_len}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    splits = []
    for window in held_out_windows(tokenizer, seq_len).tolist():
        text = tokenizer.decode(window)
        cut = len(text) - CHOICE_CHARS
        while cut > 1 and text[cut - 1].isspace():  # the harness would move it out of the context
            cut -= 1
        splits.append((text[:cut], text[cut:]))
    data = folder / "continuation.jsonl"
    with data.open("w") as f:
        for i, (context, _) in enumerate(splits):
            endings = [splits[(i + j) % len(splits)][1] for j in range(CHOICES)]
            gold = i % CHOICES
            endings[0], endings[gold] = endings[gold], endings[0]
            f.write(json.dumps({"context": context, "choices": endings, "gold": gold}) + "\n")
    (folder / f"{CHOICE_TASK}.yaml").write_text(_CHOICE_YAML.replace("DATA", json.dumps(str(data.resolve()))))
    return folder


@torch.no_grad()
def task_accuracy(model: DeaMoELM, folder: str | Path, tokenizer: Tokenizer, limit: int | None = None) -> float:
    """The continuation task's acc (of its first `limit` documents) computed by deamoe-trt's
    own model, without the harness."""
    right = total = 0
    for line in (Path(folder) / "continuation.jsonl").read_text().splitlines()[:limit]:
        doc = json.loads(line)
        context = tokenizer.encode(doc["context"], what="the task's text")
        scores = []
        for choice in doc["choices"]:
            ids = torch.tensor([context + tokenizer.encode(choice, what="the task's text")])
            log_probs = torch.log_softmax(model(ids[:, :-1]).logits.double(), dim=-1)[0]
            targets = ids[0, len(context) :]
            scores.append(log_probs[len(context) - 1 :].gather(-1, targets[:, None]).sum().item())
        right += int(max(range(len(scores)), key=lambda j: (scores[j], -j)) == doc["gold"])
        total += 1
    return right / total


def run_local_tasks(
    models: dict[str, DeaMoELM], tokenizer: Tokenizer, folder: str | Path, limit: int | None = None
) -> dict:
    """Both local tasks (their first `limit` documents) on each model, written with export-hf
    into folder, offline, through lm-eval's Python API: {name: {task: {metric: value}}}."""
    import os

    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        from ..errors import MissingDependencyError

        raise MissingDependencyError("lm-eval is not installed; pip install lm-eval") from None
    from ..export.hf import write_hf_dir

    folder = Path(folder)
    seq_len = min(128, min(m.config.max_position_embeddings for m in models.values()) - 1)
    tasks = folder / "tasks"
    write_held_out_task(tasks, tokenizer, seq_len)
    write_choice_task(tasks, tokenizer, seq_len)
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update(dict.fromkeys(saved, "1"))
    try:
        out = {}
        for name, model in models.items():
            directory = write_hf_dir(model, tokenizer, folder / name)
            results = lm_eval.simple_evaluate(
                model="hf",
                # the byte tokenizer has no special tokens; the harness needs a prefix id for empty contexts
                model_args=f"pretrained={directory},dtype=float32,prefix_token_id=0",
                tasks=[TASK, CHOICE_TASK],
                task_manager=TaskManager(include_path=str(tasks)),
                batch_size=16,
                device="cpu",
                limit=limit,
            )
            out[name] = {
                task: {k.split(",")[0]: v for k, v in metrics.items() if "," in k and "stderr" not in k}
                for task, metrics in results["results"].items()
            }
        return out
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
