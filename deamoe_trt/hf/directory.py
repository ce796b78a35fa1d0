"""The files of a DeaMoE model directory besides its weights, one writer for export-hf's
transformers directories and export-vllm's vLLM directories (whose weights differ: names,
shards, quantized formats)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..checkpoint import CONFIG_FILE, dtype_name
from ..lm.model import DeaMoELM
from ..lm.tokenizer import Tokenizer, write_tokenizer
from .fields import hf_fields


def is_model_dir(folder: Path) -> bool:
    """A directory write_model_files wrote: its config.json carries the DeaMoE LM's own config."""
    try:
        return "deamoe_lm" in json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return False


def write_model_files(
    folder: Path, model: DeaMoELM, tokenizer: Tokenizer, *, chat_template: str | None = None, **extra: Any
) -> None:
    """The files of a model directory besides its weights, for transformers and vLLM alike: the
    tokenizer (chat_template: the byte tokenizer's template), generation_config.json, and
    config.json (hf_fields, the dtype, extra keys, the tokenizer's end-of-text id), written last."""
    eos = write_tokenizer(tokenizer, folder, chat_template=chat_template)
    generation = {"eos_token_id": eos} if eos is not None else {}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    hf = {**hf_fields(model.config), "dtype": dtype_name(model.dtype), **extra}
    if eos is not None:
        hf["eos_token_id"] = eos
    (folder / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
