"""A local lm-evaluation-harness task: the held-out perplexity of the shipped text.

write_held_out_task(folder, tokenizer, seq_len) writes a task folder for
`lm_eval --include_path FOLDER --tasks deamoe_held_out` (or TaskManager(include_path=...)):
the windows deamoe_trt.quantize.lm.held_out_loss scores (deamoe_trt.train.lm.evaluate's
fixed windows of seq_len + 1 tokens of the last 10% of the shipped text), one document each:
its first token the context and the others the continuation (a window whose first characters
are whitespace takes them into the context too, as the harness would otherwise move them out
of it). The metric, token_perplexity, is exp of the mean negative log-likelihood per
continuation token: held_out_loss's perplexity, less the few predictions those contexts hold.
Nothing is downloaded: the documents are a JSON-lines file beside the task.

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


def write_held_out_task(folder: str | Path, tokenizer: Tokenizer, seq_len: int) -> Path:
    """Write the task folder (see the module docstring); returns it."""
    if not isinstance(tokenizer, ByteTokenizer):
        raise UsageError(
            f"the held-out task needs the byte tokenizer (one token per character), not {tokenizer.describe()}"
        )
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
